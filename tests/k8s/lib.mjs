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
//
// collectived rules (collectivedRuleErrors): checked on every schema-valid object that holds a
// pod spec, since memory reaches the sidecar only as file descriptors (the fd socket beside the
// gRPC one) and is never shared by name: no pod mounts the node's /dev/shm (a hostPath), and the
// collectived container mounts nothing at /dev/shm and keeps no capability (drop ALL, add none).

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

// ---- collectived rules --------------------------------------------------------------------------

// [pointer, pod spec] of an object: a Pod's spec, a workload's pod template, a CronJob's.
export function podSpecs(doc) {
  const out = [];
  if (doc?.kind === "Pod" && doc.spec) out.push(["/spec", doc.spec]);
  if (doc?.spec?.template?.spec) out.push(["/spec/template/spec", doc.spec.template.spec]);
  const cron = doc?.spec?.jobTemplate?.spec?.template?.spec;
  if (cron) out.push(["/spec/jobTemplate/spec/template/spec", cron]);
  return out;
}

// The node's /dev/shm (or a path under it), however it is spelt.
export function isHostShm(hostPath) {
  if (typeof hostPath !== "string") return false;
  const normal = path.posix.normalize(hostPath.replace(/\/+$/, "") || "/");
  return normal === "/dev/shm" || normal.startsWith("/dev/shm/");
}

// A collectived sidecar container: named "collectived" or running the collectived image (not
// collectived-trainer).
export function isCollectivedContainer(c) {
  const repo = String(c?.image ?? "").replace(/@.*$/, "").replace(/:[^/:]*$/, "").split("/").pop();
  return c?.name === "collectived" || repo === "collectived";
}

// Violations of the collectived rules as "pointer: message" (empty: none).
export function collectivedRuleErrors(doc) {
  const errors = [];
  for (const [at, pod] of podSpecs(doc)) {
    const hostShm = new Set();
    for (const [i, v] of (pod.volumes ?? []).entries()) {
      if (isHostShm(v?.hostPath?.path)) {
        hostShm.add(v.name);
        errors.push(`${at}/volumes/${i}/hostPath/path: hostPath ${v.hostPath.path} (the node's /dev/shm): ` +
          "memory reaches collectived as file descriptors; give the trainer its own emptyDir (medium: Memory) at /dev/shm");
      }
    }
    for (const list of ["initContainers", "containers"]) {
      for (const [i, c] of (pod[list] ?? []).entries()) {
        const cAt = `${at}/${list}/${i}`;
        for (const [j, m] of (c.volumeMounts ?? []).entries()) {
          if (hostShm.has(m.name)) {
            errors.push(`${cAt}/volumeMounts/${j}: container ${c.name} mounts the node's /dev/shm (hostPath volume ${m.name})`);
          }
        }
        if (!isCollectivedContainer(c)) continue;
        for (const [j, m] of (c.volumeMounts ?? []).entries()) {
          if (path.posix.normalize(String(m.mountPath ?? "")).replace(/\/+$/, "") === "/dev/shm") {
            errors.push(`${cAt}/volumeMounts/${j}: the collectived container mounts /dev/shm: ` +
              "it maps only the descriptors it is handed and needs none");
          }
        }
        const caps = c.securityContext?.capabilities ?? {};
        if ((caps.add ?? []).length > 0) {
          errors.push(`${cAt}/securityContext/capabilities/add: the collectived container adds capabilities ` +
            `(${caps.add.join(", ")}): it needs none`);
        }
        if (!(caps.drop ?? []).includes("ALL")) {
          errors.push(`${cAt}/securityContext/capabilities/drop: the collectived container must drop ALL capabilities`);
        }
      }
    }
  }
  return errors;
}

// Validates one object (schema, unknown fields, collectived rules): {ok, id, errors: [string]}. Identical objects (the same resource
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
  const rules = collectivedRuleErrors(doc);
  return { ok: unknown.length === 0 && rules.length === 0, id, errors: [...unknown, ...rules] };
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
