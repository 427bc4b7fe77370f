// expect: {"ok": true, "value": {"name": "CapabilityError", "message": "examples.fail failed: disk full", "capability": "examples.fail", "id": "corpus:0:0"}}
try {
  await tools.examples.fail({ message: "disk full" });
} catch (e) {
  return { name: e.name, message: e.message, capability: e.capability, id: e.toolCallId };
}
