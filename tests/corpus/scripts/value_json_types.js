// expect: {"ok": true, "value": {"n": null, "t": true, "f": 1.5, "s": "é✓🙂", "a": [1, [2]], "o": {"z": 1, "a": 2}}}
return { n: null, t: true, f: 1.5, s: "é✓🙂", a: [1, [2]], o: { z: 1, a: 2 }, skipped: undefined, fn() {} };
