//! `JSON.stringify` in the sandbox, against what the standard (and V8, for every case here)
//! gives. corral's QuickJS patch `json-stringify-fast-paths` serializes objects from their
//! keys as atoms, checks cycles on a C array and makes an array index a key string only when a
//! `toJSON` or a replacer sees it; these cases pin that nothing a script can observe changed.

use corral_tests::example_options;
use serde_json::{Value, json};

async fn value_of(script: &str) -> Value {
    let options = example_options();
    crate::isolation::run_with(options.grants, options.user, script).await
}

#[tokio::test]
async fn stringify_follows_the_standard() {
    let value = value_of(
        r#"
        const key = (k) => k + ":" + typeof k;
        const doomed = {a: 1, get b() { delete this.c; return 2; }, c: 3};
        return [
          JSON.stringify({a: 1, b: "x\n\"y\u0001\ud800", c: [1, {d: null}], e: undefined,
                          f() {}, [Symbol()]: 1, 2: "two", 1: "one"}),
          JSON.stringify({x: {toJSON: key}, y: [{toJSON: key}, {toJSON: key}]}),
          JSON.stringify({a: [1, 2], b: {c: 3}}, (k, v) => typeof v === "number" ? key(k) : v),
          JSON.stringify({a: 1, b: 2, c: 3}, ["c", "a"]),
          JSON.stringify({a: [1, {b: 2}]}, null, 2),
          JSON.stringify(doomed),
          JSON.stringify(Object.defineProperty({a: 1}, "hidden", {value: 1, enumerable: false})),
          JSON.stringify(["a\u00e9\u4e2d\ud83d\ude00", "\udc00x", "tab\there"]),
          JSON.stringify(Object.assign(Object.create({inherited: 1}), {own: 2})),
        ];
        "#,
    )
    .await;
    assert_eq!(
        value,
        json!([
            r#"{"1":"one","2":"two","a":1,"b":"x\n\"y\u0001\ud800","c":[1,{"d":null}]}"#,
            r#"{"x":"x:string","y":["0:string","1:string"]}"#,
            r#"{"a":["0:string","1:string"],"b":{"c":"c:string"}}"#,
            r#"{"c":3,"a":1}"#,
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": 2\n    }\n  ]\n}",
            r#"{"a":1,"b":2}"#,
            r#"{"a":1}"#,
            "[\"a\u{e9}\u{4e2d}\u{1f600}\",\"\\udc00x\",\"tab\\there\"]",
            r#"{"own":2}"#,
        ])
    );
}

#[tokio::test]
async fn a_proxy_is_asked_in_the_standards_order() {
    let value = value_of(
        r#"
        const seen = [];
        const p = new Proxy({a: 1, b: 2}, {
          ownKeys(t) { seen.push("ownKeys"); return ["b", "a"]; },
          getOwnPropertyDescriptor(t, k) { seen.push("gopd " + k); return Reflect.getOwnPropertyDescriptor(t, k); },
          get(t, k) { seen.push("get " + String(k)); return t[k]; },
        });
        return [JSON.stringify(p), seen.join(",")];
        "#,
    )
    .await;
    assert_eq!(
        value,
        json!([
            r#"{"b":2,"a":1}"#,
            "get toJSON,ownKeys,gopd b,gopd a,get b,get a"
        ])
    );
}

#[tokio::test]
async fn cycles_are_refused_and_deep_values_are_not_cycles() {
    let value = value_of(
        r#"
        const tryIt = (f) => { try { return f(); } catch (e) { return e.name + ": " + e.message; } };
        const cyclic = {a: 1}; cyclic.self = {back: cyclic};
        const cyclicArray = [1]; cyclicArray.push([cyclicArray]);
        // The same object twice, side by side, is not a cycle.
        const shared = {s: 1};
        const deep = []; let c = deep; for (let i = 0; i < 5000; i++) { const n = []; c.push(n); c = n; }
        return [
          tryIt(() => JSON.stringify(cyclic)),
          tryIt(() => JSON.stringify(cyclicArray)),
          JSON.stringify([shared, {x: shared}]),
          JSON.stringify(deep).length,
        ];
        "#,
    )
    .await;
    assert_eq!(
        value,
        json!([
            "TypeError: circular reference",
            "TypeError: circular reference",
            r#"[{"s":1},{"x":{"s":1}}]"#,
            10002
        ])
    );
}

#[tokio::test]
async fn a_calls_argument_reaches_the_tool_as_the_script_wrote_it() {
    let value = value_of(
        r#"
        const input = {text: "a\"b\\c\u00e9\ud83d\ude00", n: [1, 2.5, -0, null], nested: {deep: {x: true}},
                       skipped: undefined, 3: "index"};
        return await tools.examples.echo(input);
        "#,
    )
    .await;
    assert_eq!(
        value,
        json!({"3": "index", "text": "a\"b\\c\u{e9}\u{1f600}", "n": [1, 2.5, 0, null],
               "nested": {"deep": {"x": true}}})
    );
}
