// expect: {"ok": true, "value": [{"n": 1}, "string"], "logs": [{"message": "{\"still\":\"json\"}"}]}
// Replacing intrinsics the prelude uses must not break or redirect tools and logs.
Object.freeze = () => { throw new Error("hijacked freeze"); };
JSON.stringify = () => "hijacked";
Array.prototype.push = () => { throw new Error("hijacked push"); };
Promise.prototype.then = function () { throw new Error("hijacked then"); };
console.log({ still: "json" });
const result = await tools.examples.echo({ n: 1 });
return [result, typeof (await tools.examples.text({ text: "t" }))];
