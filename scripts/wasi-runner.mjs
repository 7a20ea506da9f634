// Cargo's runner for wasm32-wasip1 test binaries (`make test-wasm`): runs core's tests on the
// filter's own target in Node's built-in WASI, so no runner has to be built from source. The
// module gets its arguments and environment but no file system and no network, as in Envoy.
// Usage: node --no-warnings scripts/wasi-runner.mjs FILE.wasm [ARGS...]; Node.js 20 or later
// (scripts/bootstrap.sh checks).
import { readFile } from 'node:fs/promises';
import { WASI } from 'node:wasi';
import { argv, env, exit } from 'node:process';

const [file, ...args] = argv.slice(2);
if (!file) {
  console.error('wasi-runner: usage: node scripts/wasi-runner.mjs FILE.wasm [ARGS...]');
  exit(2);
}
const wasi = new WASI({ version: 'preview1', args: [file, ...args], env, preopens: {}, returnOnExit: true });
const module = await WebAssembly.compile(await readFile(file));
const instance = await WebAssembly.instantiate(module, wasi.getImportObject());
try {
  exit(wasi.start(instance));
} catch (error) {
  // wasm32-wasip1 aborts on panic: the test on the last "test … ..." line failed, with the
  // message above when the harness ran with --nocapture.
  console.error(`wasi-runner: ${file} trapped: ${error.message}`);
  exit(101);
}
