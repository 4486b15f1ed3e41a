#!/usr/bin/env node
// Validates Kubernetes YAML files offline (schema + unknown fields), e.g.
//   node tests/k8s/validate-file.mjs my-job.yaml
//   kubectl kustomize k8s/overlays/daemonset | node tests/k8s/validate-file.mjs -
// Prints one line per object; exits 1 if any object is invalid.
import fs from "node:fs";
import { parseDocuments, validateObject } from "./lib.mjs";

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error("usage: validate-file.mjs FILE.yaml... (- = standard input)");
  process.exit(2);
}
let bad = 0;
for (const file of files) {
  let docs;
  try {
    docs = parseDocuments(fs.readFileSync(file === "-" ? 0 : file, "utf8"), file);
  } catch (err) {
    console.log(`FAIL ${file}: ${err.message}`);
    bad++;
    continue;
  }
  for (const [i, doc] of docs.entries()) {
    const r = await validateObject(doc, `${file}#${i}`);
    if (r.ok) {
      console.log(`ok   ${r.id}`);
    } else {
      bad++;
      console.log(`FAIL ${r.id}`);
      for (const e of r.errors) console.log(`     ${e}`);
    }
  }
}
process.exit(bad > 0 ? 1 : 0);
