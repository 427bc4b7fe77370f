// expect: {"ok": true, "value": ["string", "{\"looks\": \"like json\"}"]}
const text = await tools.examples.text({ text: '{"looks": "like json"}' });
return [typeof text, text];
