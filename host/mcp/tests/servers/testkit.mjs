// A small MCP server (stdio) for corral-mcp's tests, on the TypeScript SDK's low-level Server:
// tools/list in pages of 3, a barrier proving concurrency, a slow tool that counts cancellations,
// isError, a crash, an environment probe, a cyclic schema, annotations and list_changed.
//   node testkit.mjs [normal|never-init]
// The SDK is found through CORRAL_MCP_NODE_MODULES (target/node-tools/mcp/node_modules).
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.env.CORRAL_MCP_NODE_MODULES;
if (!modules) {
  console.error("testkit: set CORRAL_MCP_NODE_MODULES");
  process.exit(2);
}
const sdk = (path) => import(pathToFileURL(join(modules, "@modelcontextprotocol/sdk/dist/esm", path)).href);

const mode = process.argv[2] ?? "normal";
if (mode === "never-init") {
  // Reads requests and never answers, not even initialize.
  console.error("testkit: never answering");
  process.stdin.resume();
  setInterval(() => {}, 1 << 30);
} else {
  const { Server } = await sdk("server/index.js");
  const { StdioServerTransport } = await sdk("server/stdio.js");
  const { ListToolsRequestSchema, CallToolRequestSchema } = await sdk("types.js");

  const object = (properties = {}, required = []) => ({ type: "object", properties, required, additionalProperties: false });
  const tools = [
    { name: "echo", description: "Returns the text.", inputSchema: object({ text: { type: "string" } }, ["text"]) },
    { name: "noop", description: "Does nothing.", inputSchema: object() },
    { name: "barrier", description: "Resolves once n calls are in flight at once.", inputSchema: object({ n: { type: "integer", minimum: 1 } }, ["n"]) },
    { name: "slow", description: "Waits ms milliseconds.", inputSchema: object({ ms: { type: "integer" } }, ["ms"]) },
    {
      name: "stats", description: "What this process has seen.", inputSchema: object(),
      outputSchema: object({ pid: { type: "integer" }, calls: { type: "object", additionalProperties: { type: "integer" } }, cancelled: { type: "integer" }, lists: { type: "integer" } }, ["pid", "calls", "cancelled", "lists"]),
    },
    { name: "strict", description: "Takes an integer.", inputSchema: object({ n: { type: "integer" } }, ["n"]) },
    { name: "fail", description: "Always fails.", inputSchema: object({ message: { type: "string" } }, ["message"]) },
    { name: "crash", description: "Exits in the middle of the call.", inputSchema: object() },
    { name: "env", description: "Reads an environment variable.", inputSchema: object({ name: { type: "string" } }, ["name"]) },
    { name: "add_tool", description: "Adds a tool and announces it.", inputSchema: object({ name: { type: "string" } }, ["name"]) },
    {
      name: "cyclic", description: "A schema that refers to itself.",
      inputSchema: { type: "object", properties: { node: { $ref: "#/$defs/node" } }, $defs: { node: { type: "object", properties: { next: { $ref: "#/$defs/node" } } } } },
    },
    { name: "delete_all", description: "Deletes everything.", inputSchema: object(), annotations: { destructiveHint: true } },
    { name: "peek", description: "Looks.", inputSchema: object(), annotations: { readOnlyHint: true, destructiveHint: true } },
  ];
  const calls = {};
  let cancelled = 0;
  let lists = 0; // tools/list requests for the first page: how often the client listed
  let inFlight = 0;
  const waiting = [];
  const text = (t) => ({ content: [{ type: "text", text: String(t) }] });

  const server = new Server({ name: "corral-testkit", version: "1.0.0" }, { capabilities: { tools: { listChanged: true } } });
  server.setRequestHandler(ListToolsRequestSchema, async (request) => {
    const start = Number(request.params?.cursor ?? 0);
    if (start === 0) lists += 1;
    const page = tools.slice(start, start + 3);
    const next = start + 3 < tools.length ? String(start + 3) : undefined;
    return next === undefined ? { tools: page } : { tools: page, nextCursor: next };
  });
  server.setRequestHandler(CallToolRequestSchema, async (request, extra) => {
    const { name, arguments: args = {} } = request.params;
    calls[name] = (calls[name] ?? 0) + 1;
    switch (name) {
      case "echo": return text(args.text);
      case "noop": return text("ok");
      case "barrier": {
        inFlight += 1;
        try {
          if (inFlight >= args.n) {
            waiting.splice(0).forEach((wake) => wake());
            return text(`released with ${inFlight} in flight`);
          }
          const reached = await new Promise((resolve) => {
            waiting.push(() => resolve(true));
            setTimeout(() => resolve(false), 10000);
          });
          return reached ? text("released") : { isError: true, ...text(`barrier of ${args.n} not reached: ${inFlight} in flight`) };
        } finally {
          inFlight -= 1;
        }
      }
      case "slow":
        return await new Promise((resolve) => {
          const timer = setTimeout(() => resolve(text(`slept ${args.ms}`)), args.ms);
          extra.signal.addEventListener("abort", () => {
            clearTimeout(timer);
            cancelled += 1;
            console.error(`testkit: request ${extra.requestId} cancelled`);
            resolve(text("cancelled"));
          });
        });
      case "stats": {
        const value = { pid: process.pid, calls, cancelled, lists };
        return { ...text(JSON.stringify(value)), structuredContent: value };
      }
      case "strict": return text(args.n);
      case "fail": return { isError: true, ...text(args.message) };
      case "crash":
        console.error("testkit: crashing now");
        setTimeout(() => process.exit(3), 20);
        return await new Promise(() => {});
      case "env": return text(process.env[args.name] ?? "(unset)");
      case "add_tool":
        tools.push({ name: args.name, description: "Added later.", inputSchema: object() });
        await server.sendToolListChanged();
        return text("added");
      default: return { isError: true, ...text(`unknown tool ${name}`) };
    }
  });
  console.error("testkit: ready");
  await server.connect(new StdioServerTransport());
}
