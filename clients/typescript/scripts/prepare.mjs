// npm's `prepare`: generates src/gen/ from proto/ and compiles dist/. It runs on `npm ci` or
// `npm install` in this folder, on `npm pack` (so the tarball holds src/gen/ and dist/), and in
// a project that installs this folder as a dependency (`npm install path/to/clients/typescript`).
// There npm links the folder without installing its devDependencies (buf, protoc-gen-es,
// typescript), so they are installed first, here, from package-lock.json.
//
// Installed from the tarball (`npm install outboxd-client-0.1.0.tgz`), there is no proto/ to
// generate from, and nothing to do: the tarball carries the generated code and dist/.
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(dirname(fileURLToPath(import.meta.url)));
const npm = process.platform === "win32" ? "npm.cmd" : "npm";

function run(args) {
  const r = spawnSync(npm, args, { cwd: here, stdio: "inherit" });
  if (r.status !== 0) {
    console.error(`@outboxd/client: \`npm ${args.join(" ")}\` failed in ${here}`);
    process.exit(r.status ?? 1);
  }
}

if (!existsSync(join(here, "..", "..", "proto", "outbox", "v1", "outbox.proto"))) {
  const built = ["dist/index.js", "dist/index.d.ts", "src/gen/outbox/v1/admin_pb.ts", "src/gen/outbox/v1/outbox_pb.ts"];
  if (built.every((f) => existsSync(join(here, f)))) {
    process.exit(0);
  }
  console.error("@outboxd/client: proto/outbox/v1 is missing and the package is not built: build it inside the outboxd repository (clients/typescript), or install the tarball that `npm pack` makes there");
  process.exit(1);
}
const tools = ["@bufbuild/buf", "@bufbuild/protoc-gen-es", "typescript"];
if (tools.some((t) => !existsSync(join(here, "node_modules", t, "package.json")))) {
  run(["ci", "--ignore-scripts", "--include=dev", "--no-audit", "--no-fund", "--loglevel=error"]);
}
run(["run", "build"]);
