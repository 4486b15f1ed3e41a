// Offline validation of Kubernetes objects: the schema validators of the npm packages
// kubernetes-models (the Kubernetes OpenAPI schemas, compiled to ajv validators) and
// @kubernetes-models/prometheus-operator (the Prometheus Operator's CRD schemas) and
// @kubernetes-models/cert-manager (cert-manager's CRD schemas), plus an
// unknown-field check that those validators do not do by themselves.
//
// Unknown fields: the compiled validators only constrain the properties a schema declares and
// let any other key through. A key K is therefore known to the schema exactly when the schema
// constrains K's value: validateObject() replaces the value at K with `true` and then with a
// string, in an otherwise valid object; if neither replacement makes validation fail, nothing
// in the schema looks at K, and K is reported as an unknown field (what `kubectl apply
// --validate=strict` rejects). The only keys this would wrongly flag are values the schema
// leaves completely free (x-kubernetes-preserve-unknown-fields, RawExtension); the manifests
// here have none, and the check descends only into values the schema does constrain.

import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import YAML from "yaml";

export const here = path.dirname(fileURLToPath(import.meta.url));
export const root = path.resolve(here, "../..");
export const k8sDir = path.join(root, "k8s");

// apiVersion -> module that exports one model class per kind.
function moduleFor(apiVersion) {
  if (apiVersion === "monitoring.coreos.com/v1") {
    return "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
  }
  if (apiVersion === "cert-manager.io/v1") {
    return "@kubernetes-models/cert-manager/cert-manager.io/v1";
  }
  if (!/^[a-z0-9.-]*\/?v[0-9]+((alpha|beta)[0-9]+)?$/.test(apiVersion)) return null;
  return `kubernetes-models/${apiVersion}`;
}

const modelCache = new Map();
export async function modelFor(apiVersion, kind) {
  const key = `${apiVersion}/${kind}`;
  if (modelCache.has(key)) return modelCache.get(key);
  let model = null;
  const mod = moduleFor(apiVersion);
  if (mod) {
    try {
      const exports = await import(mod);
      const candidate = exports[kind];
      if (typeof candidate === "function" && candidate.apiVersion === apiVersion &&
          candidate.kind === kind) {
        model = candidate;
      }
    } catch {
      model = null;
    }
  }
  modelCache.set(key, model);
  return model;
}

// Schema errors of `doc` as [{path, message}] (empty: valid).
function schemaErrors(Model, doc) {
  try {
    // The model's validate() runs the compiled schema validator on `this`; calling it on the
    // plain object skips the model's deep copy (the probe below calls this thousands of times).
    Model.prototype.validate.call(doc);
    return [];
  } catch (err) {
    const list = err.errors ?? [{ instancePath: "", message: String(err.message ?? err) }];
    return list.map((e) => ({
      path: e.instancePath || "/",
      message: `${e.message ?? e.keyword}${e.params ? " " + JSON.stringify(e.params) : ""}`,
    }));
  }
}

const PROBES = [true, "collectived-validation-probe"];

// Real fields that the compiled validators leave unconstrained, so the probe cannot see them.
// Each entry is checked against the Kubernetes API reference by hand; keep the list short.
const UNCONSTRAINED = [
  // scheduling.k8s.io/v1 PriorityClass.description (string): kubernetes-models' generator
  // drops schema properties literally named "description".
  { kind: "PriorityClass", path: /^\/description$/ },
];

// Unknown keys of `doc` (JSON pointers), given that `doc` is schema-valid.
function unknownFields(Model, doc) {
  const unknown = [];
  const walk = (value, pointer) => {
    if (Array.isArray(value)) {
      value.forEach((item, i) => walk(item, [...pointer, i]));
      return;
    }
    if (value === null || typeof value !== "object") return;
    for (const key of Object.keys(value)) {
      const at = [...pointer, key];
      let constrained = false;
      const original = value[key];
      for (const probe of PROBES) {
        value[key] = probe;  // in place (doc is our own copy), restored below
        const failed = schemaErrors(Model, doc).length > 0;
        value[key] = original;
        if (failed) {
          constrained = true;
          break;
        }
      }
      const pointerText = "/" + at.join("/");
      if (!constrained && UNCONSTRAINED.some((u) => u.kind === doc.kind && u.path.test(pointerText))) {
        continue;
      }
      if (constrained) {
        walk(value[key], at);
      } else {
        unknown.push("/" + at.join("/"));
      }
    }
  };
  walk(doc, []);
  return unknown;
}

// Validates one object: {ok, id, errors: [string]}. Identical objects (the same resource
// rendered by several kustomizations) are checked once.
const resultCache = new Map();
export async function validateObject(doc, where = "") {
  const key = JSON.stringify(doc);
  if (!resultCache.has(key)) resultCache.set(key, await validateUncached(doc));
  const r = resultCache.get(key);
  const id = `${doc?.kind ?? "?"}/${doc?.metadata?.name ?? "?"}${where ? ` (${where})` : ""}`;
  return { ...r, id };
}

async function validateUncached(doc, where = "") {
  const id = `${doc?.kind ?? "?"}/${doc?.metadata?.name ?? "?"}${where ? ` (${where})` : ""}`;
  if (!doc || typeof doc !== "object" || Array.isArray(doc)) {
    return { ok: false, id, errors: ["not a YAML mapping"] };
  }
  if (typeof doc.apiVersion !== "string" || typeof doc.kind !== "string") {
    return { ok: false, id, errors: ["no apiVersion/kind"] };
  }
  const Model = await modelFor(doc.apiVersion, doc.kind);
  if (!Model) {
    return { ok: false, id, errors: [`no schema for ${doc.apiVersion} ${doc.kind}: cannot validate`] };
  }
  const errors = schemaErrors(Model, doc).map((e) => `${e.path}: ${e.message}`);
  if (errors.length > 0) return { ok: false, id, errors };
  const unknown = unknownFields(Model, structuredClone(doc)).map((p) => `${p}: unknown field (not in the ${doc.kind} schema)`);
  if (!doc.metadata?.name) unknown.push("/metadata/name: missing");
  return { ok: unknown.length === 0, id, errors: unknown };
}

export function parseDocuments(text, file = "") {
  const docs = YAML.parseAllDocuments(text, { prettyErrors: true });
  const out = [];
  for (const d of docs) {
    if (d.errors.length > 0) throw new Error(`${file}: YAML: ${d.errors.map((e) => e.message).join("; ")}`);
    const value = d.toJS();
    if (value !== null && value !== undefined) out.push(value);
  }
  return out;
}

export async function validateFile(file) {
  const docs = parseDocuments(fs.readFileSync(file, "utf8"), file);
  const results = [];
  for (const [i, doc] of docs.entries()) {
    results.push(await validateObject(doc, `${path.relative(root, file)}#${i}`));
  }
  return results;
}

// ---- kustomize --------------------------------------------------------------------------------

export function kubectlAvailable() {
  const r = spawnSync("kubectl", ["version", "--client"], { encoding: "utf8" });
  return r.status === 0;
}

// Directories under k8s/ holding a kustomization.yaml of kind Kustomization (not Component).
export function kustomizations() {
  const found = [];
  const walk = (dir) => {
    for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
      if (entry.isDirectory()) walk(path.join(dir, entry.name));
    }
    const file = path.join(dir, "kustomization.yaml");
    if (fs.existsSync(file)) {
      const k = YAML.parse(fs.readFileSync(file, "utf8"));
      found.push({ dir, kind: k.kind ?? "Kustomization", spec: k });
    }
  };
  walk(k8sDir);
  return found.sort((a, b) => a.dir.localeCompare(b.dir));
}

export function render(dir) {
  const r = spawnSync("kubectl", ["kustomize", dir], { encoding: "utf8", maxBuffer: 64 << 20 });
  if (r.status !== 0) throw new Error(`kubectl kustomize ${path.relative(root, dir)}: ${r.stderr}`);
  return parseDocuments(r.stdout, dir);
}

// Every file a kustomization or component lists as a resource (relative to k8s/), recursively.
export function referencedFiles() {
  const files = new Set();
  for (const { dir, spec } of kustomizations()) {
    for (const res of spec.resources ?? []) {
      const p = path.resolve(dir, res);
      if (fs.existsSync(p) && fs.statSync(p).isFile()) files.add(path.relative(k8sDir, p));
    }
  }
  return files;
}

export function manifestFiles() {
  const out = [];
  const walk = (dir) => {
    for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
      const p = path.join(dir, entry.name);
      if (entry.isDirectory()) {
        if (path.relative(k8sDir, p) !== "prometheus" && path.relative(k8sDir, p) !== "grafana") walk(p);
      } else if (/\.ya?ml$/.test(entry.name) && entry.name !== "kustomization.yaml") {
        out.push(p);
      }
    }
  };
  walk(k8sDir);
  return out.sort();
}

// ---- Prometheus --------------------------------------------------------------------------------

export function promtool(args, options = {}) {
  return spawnSync("promtool", args, { encoding: "utf8", ...options });
}

// collectived_* metric names a PromQL text refers to (histogram series folded to the family).
export function metricNames(text) {
  const names = new Set();
  for (const m of text.matchAll(/\bcollectived_[a-z0-9_]+/g)) {
    names.add(m[0].replace(/_(bucket|sum|count)$/, ""));
  }
  return names;
}

// Metric names the daemon registers (string literals in services/collectived/metrics.cc).
export function exportedMetricNames() {
  const file = path.join(root, "services/collectived/metrics.cc");
  if (!fs.existsSync(file)) return null;
  const names = new Set();
  for (const m of fs.readFileSync(file, "utf8").matchAll(/"(collectived_[a-z0-9_]+)"/g)) names.add(m[1]);
  return names;
}
