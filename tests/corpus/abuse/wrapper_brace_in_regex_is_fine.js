// expect: {"ok": true, "value": true}
return /}\)\(\)/.test('})()')
