// Two calls run at once on the host: the script waits about 200 ms in all, not 400.
console.log("starting two sleeps");
const [first, second] = await Promise.all([
  tools.examples.sleep({ ms: 200 }),
  tools.examples.sleep({ ms: 200 }),
]);
const greeting = await tools.examples.echo({ hello: user ? user.displayName : "world" });
log("info", "both sleeps finished", { first, second });
return { first, second, greeting };
