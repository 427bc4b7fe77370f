// Per-call time of server-everything's `echo` called straight from the MCP TypeScript SDK, over
// stdio and streamable HTTP: the peer of `cargo run --release -p corral-mcp --example
// call_overhead`. Same server, same tool, same number of calls; one JSON line per transport.
// The SDK and the server are the ones host/mcp/tests/install-servers.sh installs (same pinned
// versions as corral's MCP tests), found through CORRAL_MCP_NODE_MODULES.
//   CORRAL_MCP_NODE_MODULES=target/node-tools/mcp/node_modules node direct.mjs [CALLS]
import { spawn } from "node:child_process";
import { connect, createServer } from "node:net";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const modules = resolve(process.env.CORRAL_MCP_NODE_MODULES ?? "../../../target/node-tools/mcp/node_modules");
const sdk = async (path) => import(pathToFileURL(join(modules, "@modelcontextprotocol/sdk/dist/esm", path)).href);
const { Client } = await sdk("client/index.js");
const { StdioClientTransport } = await sdk("client/stdio.js");
const { StreamableHTTPClientTransport } = await sdk("client/streamableHttp.js");

const calls = Number(process.argv[2] ?? 2000);
const everything = join(modules, "@modelcontextprotocol/server-everything/dist/index.js");

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

// A port the kernel just handed out and took back, so no other listener holds it.
const freePort = () => new Promise((done, fail) => {
  const probe = createServer();
  probe.on("error", fail);
  probe.listen(0, "127.0.0.1", () => { const { port } = probe.address(); probe.close(() => done(port)); });
});

// Starts server-everything over streamable HTTP and waits (up to 30 s) until it accepts
// connections. A server that exits first (its port taken in the meantime) is started again on
// another port, up to three times.
async function startHttpServer() {
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const server = spawn(process.execPath, [everything, "streamableHttp"], { env: { ...process.env, PORT: String(port) }, stdio: "ignore" });
    let exited = null;
    server.on("exit", (code, signal) => { exited = signal ?? code; });
    for (let tries = 0; exited === null; tries++) {
      const up = await new Promise((done) => {
        const socket = connect(port, "127.0.0.1", () => { socket.end(); done(true); });
        socket.on("error", () => done(false));
      });
      if (up) return { server, port };
      if (tries > 300) {
        server.kill();
        throw new Error(`server-everything did not listen on ${port} within 30 s`);
      }
      await new Promise((done) => setTimeout(done, 100));
    }
    if (attempt >= 3) throw new Error(`server-everything exited (${exited}) before listening, ${attempt} times`);
  }
}

const { server, port } = await startHttpServer();
try {
  await measure("http", new StreamableHTTPClientTransport(new URL(`http://127.0.0.1:${port}/mcp`)));
} finally {
  server.kill();
}
