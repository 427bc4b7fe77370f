// expect: {"ok": false, "error": {"kind": "script_error", "name": "QuotaError", "message": "over quota"}}
class QuotaError extends Error {
  constructor(message) { super(message); this.name = "QuotaError"; }
}
await null;
throw new QuotaError("over quota");
