// Per-call time of server-everything's `echo` called straight from the MCP TypeScript SDK, over
// stdio and streamable HTTP: the peer of `cargo run --release -p corral-mcp --example
// call_overhead`. Same server, same tool, same number of calls; one JSON line per transport.
//   (cd bench/peers/mcp && npm install && node direct.mjs [CALLS])
import { spawn } from "node:child_process";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const calls = Number(process.argv[2] ?? 2000);
const require = createRequire(import.meta.url);
const everything = join(dirname(require.resolve("@modelcontextprotocol/server-everything/package.json")), "dist/index.js");

async function measure(transportName, transport) {
  const client = new Client({ name: "bench", version: "1.0.0" });
  await client.connect(transport);
  const samples = [];
  for (let i = 0; i < calls + 100; i++) {
    const started = process.hrtime.bigint();
    await client.callTool({ name: "echo", arguments: { message: "x" } });
    if (i >= 100) samples.push(Number(process.hrtime.bigint() - started) / 1000);
  }
  samples.sort((a, b) => a - b);
  const mean = samples.reduce((a, b) => a + b, 0) / samples.length;
  console.log(JSON.stringify({
    client: "TypeScript SDK", transport: transportName, calls,
    p50_us: samples[samples.length >> 1], p99_us: samples[Math.floor(samples.length * 0.99)], mean_us: mean,
  }));
  await client.close();
}

await measure("stdio", new StdioClientTransport({ command: process.execPath, args: [everything, "stdio"], stderr: "ignore" }));
const port = 30000 + Math.floor(Math.random() * 20000);
const server = spawn(process.execPath, [everything, "streamableHttp"], { env: { ...process.env, PORT: String(port) }, stdio: "ignore" });
await new Promise((resolve) => setTimeout(resolve, 1500));
try {
  await measure("http", new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${port}/mcp`)));
} finally {
  server.kill();
}
