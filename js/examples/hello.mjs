import { createSandbox } from '@corral/sandbox'

const sandbox = createSandbox()
const weather = async ({ city }) => { await new Promise((r) => setTimeout(r, 50)); return { city, celsius: 21 } }
const session = await sandbox.session({ tools: { 'weather.now': weather } })
const report = await session.run(`
  const all = await Promise.all(["Oslo", "Lima"].map((city) => tools.weather.now({ city })));
  return all.map((w) => w.city + ": " + w.celsius + "°C");`)
console.log(JSON.stringify(report.value)) // ["Oslo: 21°C","Lima: 21°C"]
session.close(); sandbox.close()
