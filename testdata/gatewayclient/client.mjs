// The TypeScript SDK client of the gateway's interop test (internal/gateway/tsclient_test.go,
// issue 15 item 5). It speaks MCP 2025-11-25 over streamable HTTP with the bearer token from
// $MCPSYNC_GATEWAY_TOKEN (never from argv: a token on a command line is visible to every user
// of the machine) and prints one JSON object per line on stdout, one per step:
//
//   node client.mjs flow URL URI [FORBIDDEN_URI]
//     connected {protocolVersion} → list {resources} → read {…} → [forbidden {code, data, message}]
//     → subscribed; then it waits for notifications/resources/updated of URI (the test changes
//     the upstream resource once it sees "subscribed") → updated {uri} → reread {…}; then it
//     reads commands on stdin: "read" → attempt {ok, …} (the read's step, or its error's
//     MCP code, HTTP status, data and message); "done" or EOF → done {updates, listChanged}
//     (the notifications counted by then), and it exits.
//   node client.mjs noauth URL
//     connects without a token → error {status, message}.
//
// Each read step carries the text, the mimeType, the version meta (_meta["mcpsync/version"])
// and digestOK: whether meta.digest is "sha256:" and the hex SHA-256 of the content's bytes.
// Any failure prints fatal {message} and exits 1.
import { createHash } from 'node:crypto';
import { createInterface } from 'node:readline';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import {
  ResourceUpdatedNotificationSchema,
  ResourceListChangedNotificationSchema,
  McpError,
} from '@modelcontextprotocol/sdk/types.js';

const out = (o) => process.stdout.write(JSON.stringify(o) + '\n');
const fail = (message) => {
  out({ step: 'fatal', message });
  process.exit(1);
};
const WAIT_MS = 90_000;

function readStep(step, res) {
  const c = res.contents?.[0];
  if (!c) fail(`${step}: no contents`);
  const bytes = c.blob !== undefined ? Buffer.from(c.blob, 'base64') : Buffer.from(c.text ?? '', 'utf8');
  // The version meta is on the content; the result carries the same.
  const meta = c._meta?.['mcpsync/version'] ?? res._meta?.['mcpsync/version'] ?? null;
  const digest = 'sha256:' + createHash('sha256').update(bytes).digest('hex');
  return { step, uri: c.uri, text: c.text ?? null, mimeType: c.mimeType ?? null, meta, digest, digestOK: meta?.digest === digest };
}

function connectClient(url, token) {
  const requestInit = token ? { headers: { Authorization: `Bearer ${token}` } } : {};
  const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit });
  const client = new Client({ name: 'mcpsync-gateway-ts-test', version: '1.0.0' }, { capabilities: {} });
  return { client, transport };
}

async function flow(url, uri, forbidden) {
  const token = process.env.MCPSYNC_GATEWAY_TOKEN;
  if (!token) fail('MCPSYNC_GATEWAY_TOKEN is not set');
  const { client, transport } = connectClient(url, token);
  let updates = 0;
  let listChanged = 0;
  let onUpdate = null;
  client.onerror = (e) => process.stderr.write(`client error: ${e?.stack ?? e}\n`);
  client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => {
    if (n.params.uri !== uri) {
      process.stderr.write(`resources/updated for another URI: ${n.params.uri}\n`);
      return;
    }
    updates++;
    onUpdate?.(n.params.uri);
  });
  client.setNotificationHandler(ResourceListChangedNotificationSchema, () => {
    listChanged++;
  });
  await client.connect(transport);
  out({ step: 'connected', protocolVersion: transport.protocolVersion ?? null, server: client.getServerVersion() ?? null });

  const list = await client.listResources();
  out({ step: 'list', resources: list.resources.map((r) => ({ uri: r.uri, name: r.name, mimeType: r.mimeType ?? null, meta: r._meta ?? null })) });

  out(readStep('read', await client.readResource({ uri })));

  if (forbidden) {
    try {
      await client.readResource({ uri: forbidden });
      out({ step: 'forbidden', code: null, message: 'read succeeded' });
    } catch (e) {
      out({ step: 'forbidden', code: e instanceof McpError ? e.code : null, data: e?.data ?? null, message: String(e.message ?? e) });
    }
  }

  const updated = new Promise((resolve, reject) => {
    onUpdate = resolve;
    setTimeout(() => reject(new Error(`no notifications/resources/updated for ${uri} within ${WAIT_MS} ms`)), WAIT_MS).unref();
  });
  await client.subscribeResource({ uri });
  out({ step: 'subscribed', uri });
  out({ step: 'updated', uri: await updated });

  out(readStep('reread', await client.readResource({ uri })));

  // Commands on stdin: "read" reads URI again and prints attempt {ok, text | code, status,
  // data, message}; "done" (or the end of stdin) prints done and ends.
  const rl = createInterface({ input: process.stdin });
  for await (const line of rl) {
    if (line.trim() === 'read') {
      try {
        const r = readStep('attempt', await client.readResource({ uri }));
        out({ ...r, ok: true });
      } catch (e) {
        out({
          step: 'attempt', ok: false, code: e instanceof McpError ? e.code : null,
          status: e instanceof StreamableHTTPError ? e.code : null, data: e?.data ?? null, message: String(e.message ?? e),
        });
      }
      continue;
    }
    break;
  }
  rl.close();
  out({ step: 'done', updates, listChanged });
  await client.close();
}

async function noauth(url) {
  const { client, transport } = connectClient(url, null);
  try {
    await client.connect(transport);
    out({ step: 'error', status: null, message: 'connected without a token' });
  } catch (e) {
    out({ step: 'error', status: e instanceof StreamableHTTPError ? e.code : null, message: String(e.message ?? e) });
  }
}

const [mode, url, uri, forbidden] = process.argv.slice(2);
try {
  if (mode === 'flow' && url && uri) await flow(url, uri, forbidden);
  else if (mode === 'noauth' && url) await noauth(url);
  else fail('usage: node client.mjs flow URL URI [FORBIDDEN_URI] | noauth URL');
} catch (e) {
  fail(String(e?.stack ?? e));
}
process.exit(0);
