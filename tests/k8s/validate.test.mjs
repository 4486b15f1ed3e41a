// Offline validation of k8s/ (node's test runner): run through tests/k8s/validate.sh.
//   - every kustomization renders (kubectl kustomize) and every rendered object is valid against
//     the Kubernetes OpenAPI schemas / the Prometheus Operator CRD schemas, with no unknown field;
//   - every manifest file is valid on its own and belongs to a kustomization;
//   - the deployment rules of the issue hold (native sidecar, probes, shm, rollout...), and the
//     collectived rules of lib.mjs (no hostPath /dev/shm anywhere; the sidecar mounts no
//     /dev/shm and keeps no capability) hold for every object (validateObject checks them);
//   - each deliberately broken manifest of tests/k8s/broken fails, with the expected message;
//   - Prometheus config and rules pass promtool, the PrometheusRule equals rules.yml, the
//     Grafana dashboard's queries parse, and every collectived_* metric they use is exported.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, test } from "node:test";
import YAML from "yaml";
import {
  exportedMetricNames, here, isCollectivedContainer, isHostShm, k8sDir, kubectlAvailable,
  kustomizations, manifestFiles, metricNames, parseDocuments, podSpecs, promtool,
  referencedFiles, render, root, validateFile, validateObject,
} from "./lib.mjs";

const rel = (p) => path.relative(root, p);
const haveKubectl = kubectlAvailable();
const roots = kustomizations().filter((k) => k.kind === "Kustomization");

// Rendered objects of every kustomization root (kubectl kustomize), by directory.
const rendered = new Map();
if (haveKubectl) for (const k of roots) rendered.set(rel(k.dir), render(k.dir));

function find(dir, kind, name) {
  const docs = rendered.get(dir) ?? [];
  const doc = docs.find((d) => d.kind === kind && (!name || d.metadata.name === name));
  assert.ok(doc, `${dir}: no ${kind}${name ? "/" + name : ""}`);
  return doc;
}

describe("kustomize: render and validate", { skip: !haveKubectl && "kubectl not found (kubectl kustomize renders offline)" }, () => {
  for (const k of roots) {
    const dir = rel(k.dir);
    test(`${dir} renders`, () => {
      assert.ok(rendered.get(dir).length > 0, "renders no object");
    });
    for (const doc of rendered.get(dir) ?? []) {
      test(`${dir}: ${doc.kind}/${doc.metadata?.name} is valid`, async () => {
        const r = await validateObject(doc, dir);
        assert.ok(r.ok, `${r.id}:\n  ${r.errors.join("\n  ")}`);
      });
    }
  }
});

describe("manifest files", () => {
  for (const file of manifestFiles()) {
    test(`${rel(file)} is valid on its own`, async () => {
      for (const r of await validateFile(file)) assert.ok(r.ok, `${r.id}:\n  ${r.errors.join("\n  ")}`);
    });
  }
  test("every manifest file is a resource of some kustomization or component", () => {
    const referenced = referencedFiles();
    const orphans = manifestFiles().map((f) => path.relative(k8sDir, f)).filter((f) => !referenced.has(f));
    assert.deepEqual(orphans, []);
  });
});

describe("deployment rules", { skip: !haveKubectl && "needs kubectl kustomize" }, () => {
  // Health over the Unix socket: the TCP listener requires a client certificate (mutual TLS),
  // which the kubelet's native gRPC probes cannot present.
  const probesHealthOverSocket = (c, probe) => {
    const command = c[probe]?.exec?.command ?? [];
    return command[0] === "collectivectl" && command.includes("health") &&
      command.some((a) => a.startsWith("unix://"));
  };
  const tlsFromSecret = (pod, c) => {
    const env = Object.fromEntries(c.env.map((e) => [e.name, e.value]));
    const mount = c.volumeMounts.find((m) => m.mountPath === "/etc/collectived/tls");
    const volume = mount && pod.volumes.find((v) => v.name === mount.name);
    return env.COLLECTIVED_TLS_CERT === "/etc/collectived/tls/tls.crt" &&
      env.COLLECTIVED_TLS_KEY === "/etc/collectived/tls/tls.key" &&
      env.COLLECTIVED_TLS_CA === "/etc/collectived/tls/ca.crt" &&
      volume?.secret?.secretName === "collectived-tls";
  };

  test("DaemonSet: health probes over the socket, mutual TLS from a Secret, rollout, resources, tolerations, socket on a hostPath, no /dev/shm, no capabilities", () => {
    const ds = find("k8s/overlays/daemonset", "DaemonSet", "collectived");
    const pod = ds.spec.template.spec;
    const c = pod.containers.find((x) => x.name === "collectived");
    for (const probe of ["startupProbe", "readinessProbe", "livenessProbe"]) {
      assert.ok(probesHealthOverSocket(c, probe), `${probe} must run collectivectl health on the socket`);
    }
    assert.ok(tlsFromSecret(pod, c), "the TCP listener serves mutual TLS from the Secret collectived-tls");
    assert.equal(ds.spec.updateStrategy.type, "RollingUpdate");
    assert.ok(ds.spec.updateStrategy.rollingUpdate.maxUnavailable >= 1);
    assert.equal(ds.spec.updateStrategy.rollingUpdate.maxSurge, 0, "two sidecars would share one socket path");
    assert.ok(c.resources.requests.cpu && c.resources.requests.memory && c.resources.limits.memory);
    assert.ok(pod.tolerations.some((t) => t.operator === "Exists" && t.effect === "NoSchedule"));
    assert.ok(c.ports.some((p) => p.name === "metrics" && p.containerPort === 9490));
    const volume = (name) => pod.volumes.find((v) => v.name === name);
    const mount = (at) => c.volumeMounts.find((m) => m.mountPath === at);
    assert.equal(volume(mount("/run/collectived").name).hostPath.path, "/run/collectived");
    // Memory arrives as file descriptors on /run/collectived/collectived.sock.fd: no /dev/shm of
    // any kind, and no CAP_DAC_OVERRIDE (nothing is opened by name).
    assert.equal(mount("/dev/shm"), undefined, "the sidecar mounts no /dev/shm");
    assert.deepEqual(pod.volumes.filter((v) => v.hostPath).map((v) => v.hostPath.path),
      ["/run/collectived", "/var/lib/collectived/post-mortems"],
      "the socket directory and the post-mortems of failed groups are the only hostPaths");
    const postMortemDir = c.env.find((e) => e.name === "COLLECTIVED_POST_MORTEM_DIR")?.value;
    assert.equal(mount(postMortemDir)?.name, "post-mortems",
      "failed groups are written to the mounted directory");
    assert.deepEqual(c.securityContext.capabilities.drop, ["ALL"]);
    assert.equal(c.securityContext.capabilities.add, undefined, "no capability is added (no DAC_OVERRIDE)");
    assert.equal(c.securityContext.allowPrivilegeEscalation, false);
    assert.equal(c.securityContext.privileged ?? false, false);
    assert.equal(ds.spec.template.metadata.labels["collectived.io/metrics"], "true");
    assert.match(c.image, /^collectived:\d+\.\d+\.\d+$/);
    const env = Object.fromEntries(c.env.map((e) => [e.name, e]));
    assert.equal(env.COLLECTIVED_ADVERTISE.valueFrom.fieldRef.fieldPath, "status.podIP");
  });

  test("native sidecar Job: restartPolicy Always init container, shared socket, the trainer's own /dev/shm, shareProcessNamespace", () => {
    for (const dir of ["k8s/jobs/native-sidecar", "k8s/jobs/native-sidecar-gpu"]) {
      const job = find(dir, "Job", "collectived-ddp");
      const pod = job.spec.template.spec;
      assert.equal(pod.shareProcessNamespace, true);
      const sidecar = pod.initContainers.find((c) => c.name === "collectived");
      assert.equal(sidecar.restartPolicy, "Always", "a native sidecar (Kubernetes >= 1.29)");
      assert.ok(probesHealthOverSocket(sidecar, "startupProbe"), "the startup probe gates the trainer");
      assert.ok(tlsFromSecret(pod, sidecar), "the sidecar serves mutual TLS from the Secret collectived-tls");
      const trainer = pod.containers.find((c) => c.name === "trainer");
      const volume = (name) => pod.volumes.find((v) => v.name === name);
      const a = sidecar.volumeMounts.find((m) => m.mountPath === "/run/collectived");
      const b = trainer.volumeMounts.find((m) => m.mountPath === "/run/collectived");
      assert.ok(a && b && a.name === b.name, "the socket directory (gRPC and .fd sockets) is one volume shared by sidecar and trainer");
      assert.ok(volume(a.name).emptyDir, "the socket directory is an emptyDir");
      assert.ok(!sidecar.volumeMounts.some((m) => m.mountPath === "/dev/shm"),
        "the sidecar mounts no /dev/shm: memory reaches it as file descriptors");
      assert.deepEqual(sidecar.securityContext.capabilities.drop, ["ALL"]);
      assert.equal(sidecar.securityContext.capabilities.add, undefined);
      const shm = volume(trainer.volumeMounts.find((m) => m.mountPath === "/dev/shm")?.name);
      assert.equal(shm?.emptyDir?.medium, "Memory", "the trainer's own /dev/shm is a memory-backed emptyDir");
      assert.ok(shm.emptyDir.sizeLimit, "/dev/shm needs a sizeLimit (sizing rule in k8s/README.md)");
      const env = Object.fromEntries(trainer.env.map((e) => [e.name, e]));
      for (const name of ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "COLLECTIVED_ADDRESS"]) {
        assert.ok(env[name], `trainer env ${name}`);
      }
      assert.ok(!sidecar.env.some((e) => ["RANK", "WORLD_SIZE"].includes(e.name)),
        "the sidecar learns rank and world size from the trainer at group creation");
      assert.equal(pod.securityContext.runAsUser, 10001, "the uid that owns the sockets (0660)");
      assert.equal(job.spec.completionMode, "Indexed");
      assert.equal(pod.subdomain, find(dir, "Service").metadata.name);
    }
    const gpu = find("k8s/jobs/native-sidecar-gpu", "Job").spec.template.spec;
    assert.match(gpu.initContainers[0].image, /-cuda$/);
    assert.ok(gpu.containers[0].resources.limits["nvidia.com/gpu"]);
  });

  test("GPU job with MPS: the MPS daemon is the first native sidecar, and the sidecar and the trainer are its clients through one pipe directory", () => {
    const pod = find("k8s/jobs/native-sidecar-gpu-mps", "Job", "collectived-ddp").spec.template.spec;
    const [daemon, sidecar] = pod.initContainers;
    assert.equal(daemon.name, "mps-control");
    assert.equal(daemon.restartPolicy, "Always");
    assert.deepEqual(daemon.command, ["nvidia-cuda-mps-control", "-f"]);
    assert.equal(sidecar.name, "collectived");
    const pipe = (c) => c.env.find((e) => e.name === "CUDA_MPS_PIPE_DIRECTORY")?.value;
    const trainer = pod.containers.find((c) => c.name === "trainer");
    for (const c of [daemon, sidecar, trainer]) {
      assert.equal(pipe(c), "/run/nvidia-mps", `${c.name}: CUDA_MPS_PIPE_DIRECTORY`);
      const mount = c.volumeMounts.find((m) => m.mountPath === "/run/nvidia-mps");
      assert.equal(mount?.name, "mps-pipe", `${c.name} mounts the pipe directory`);
    }
    assert.ok(pod.volumes.find((v) => v.name === "mps-pipe").emptyDir);
  });

  test("nodes with several GPUs: one native sidecar per GPU, each with its own socket and ports, found by LOCAL_RANK; the component is what generate.sh writes", () => {
    const dir = "k8s/jobs/native-sidecar-gpu-per-device";
    const pod = find(dir, "Job", "collectived-ddp").spec.template.spec;
    const sidecars = pod.initContainers.filter((c) => c.image.startsWith("collectived:"));
    assert.equal(sidecars.length, 8, "one sidecar per GPU of an 8-GPU node");
    const sockets = new Set(), ports = new Set();
    sidecars.forEach((c, i) => {
      const env = Object.fromEntries(c.env.map((e) => [e.name, e.value]));
      assert.equal(c.restartPolicy, "Always");
      assert.match(c.image, /-cuda$/);
      assert.equal(env.COLLECTIVED_SOCKET, `/run/collectived/gpu${i}.sock`);
      assert.ok(probesHealthOverSocket(c, "startupProbe"));
      assert.ok(c.startupProbe.exec.command.includes(`unix:///run/collectived/gpu${i}.sock`),
        `${c.name} probes its own socket`);
      sockets.add(env.COLLECTIVED_SOCKET);
      for (const p of c.ports) ports.add(p.containerPort);
    });
    assert.equal(sockets.size, 8);
    assert.equal(ports.size, 16, "distinct peer and metrics ports in the pod's one network namespace");
    const trainer = Object.fromEntries(pod.containers[0].env.map((e) => [e.name, e.value]));
    assert.equal(trainer.COLLECTIVED_ADDRESS, "unix:///run/collectived/gpu{local_rank}.sock");
    const generated = spawnSync("bash", [path.join(k8sDir, "components/gpu-per-device/generate.sh"), "8"],
      { encoding: "utf8" });
    assert.equal(generated.status, 0, generated.stderr);
    assert.equal(generated.stdout,
      fs.readFileSync(path.join(k8sDir, "components/gpu-per-device/kustomization.yaml"), "utf8"),
      "k8s/components/gpu-per-device/kustomization.yaml is stale: run generate.sh 8 > kustomization.yaml");
  });

  test("DaemonSet-mode trainers: only the socket directory is a hostPath, their own memory-backed /dev/shm with a sizeLimit", () => {
    const job = find("k8s/jobs/daemonset-trainer", "Job");
    const pod = job.spec.template.spec;
    const trainer = pod.containers.find((c) => c.name === "trainer");
    const volume = (name) => pod.volumes.find((v) => v.name === name);
    assert.deepEqual(pod.volumes.filter((v) => v.hostPath).map((v) => v.hostPath.path), ["/run/collectived"],
      "the socket directory is the only hostPath");
    const sock = volume(trainer.volumeMounts.find((m) => m.mountPath === "/run/collectived")?.name);
    assert.equal(sock?.hostPath?.path, "/run/collectived");
    const shm = volume(trainer.volumeMounts.find((m) => m.mountPath === "/dev/shm")?.name);
    assert.ok(shm?.emptyDir, "the trainer's /dev/shm is an emptyDir of its own, not the node's");
    assert.equal(shm.emptyDir.medium, "Memory");
    assert.ok(shm.emptyDir.sizeLimit, "/dev/shm needs a sizeLimit (sizing rule in k8s/README.md)");
    assert.ok(pod.securityContext.supplementalGroups.includes(10001), "the sockets are 0660, group 10001");
  });

  test("no trainer or sidecar of any kustomization mounts a hostPath /dev/shm; every collectived container mounts no /dev/shm and keeps no capability", () => {
    let sidecars = 0;
    for (const [dir, docs] of rendered) {
      for (const d of docs) {
        for (const [at, pod] of podSpecs(d)) {
          const where = `${dir}: ${d.kind}/${d.metadata.name}${at}`;
          for (const v of pod.volumes ?? []) {
            assert.ok(!isHostShm(v.hostPath?.path), `${where}: volume ${v.name} is the node's /dev/shm`);
          }
          for (const c of [...(pod.initContainers ?? []), ...pod.containers]) {
            if (!isCollectivedContainer(c)) continue;
            sidecars++;
            assert.ok(!(c.volumeMounts ?? []).some((m) => m.mountPath.replace(/\/+$/, "") === "/dev/shm"),
              `${where}: ${c.name} mounts /dev/shm`);
            assert.deepEqual(c.securityContext?.capabilities?.drop, ["ALL"], `${where}: ${c.name} drops ALL`);
            assert.equal(c.securityContext?.capabilities?.add, undefined, `${where}: ${c.name} adds no capability`);
          }
        }
      }
    }
    assert.ok(sidecars >= 3, "the DaemonSet and both native-sidecar jobs were checked");
  });

  test("cert-manager issues Secret collectived-tls: server and client auth, DNS name collectived, from the collectived CA", () => {
    const tls = find("k8s/overlays/daemonset", "Certificate", "collectived-tls");
    assert.equal(tls.spec.secretName, "collectived-tls", "the Secret the sidecars mount");
    assert.deepEqual(tls.spec.dnsNames, ["collectived"], "the name peers check (COLLECTIVED_TLS_PEER_NAME) and --sidecar-names recognises");
    for (const usage of ["server auth", "client auth"]) assert.ok(tls.spec.usages.includes(usage), usage);
    assert.equal(tls.spec.privateKey.rotationPolicy, "Always");
    assert.equal(tls.spec.issuerRef.name, "collectived-ca");
    const ca = find("k8s/overlays/daemonset", "Issuer", "collectived-ca");
    assert.equal(ca.spec.ca.secretName, find("k8s/overlays/daemonset", "Certificate", "collectived-ca").spec.secretName);
    const ds = find("k8s/overlays/daemonset", "DaemonSet", "collectived").spec.template.spec;
    const peerName = ds.containers[0].env.find((e) => e.name === "COLLECTIVED_TLS_PEER_NAME");
    assert.equal(peerName.value, "collectived");
    const admin = find("k8s/overlays/daemonset", "Certificate", "collectived-admin-tls");
    const adminNames = ds.containers[0].env.find((e) => e.name === "COLLECTIVED_ADMIN_NAMES");
    assert.ok(adminNames.value.split(",").includes(admin.spec.commonName), "the admin certificate's name may abort");
  });

  test("DaemonSet: admin actions need the admin token from a Secret file", () => {
    const pod = find("k8s/overlays/daemonset", "DaemonSet", "collectived").spec.template.spec;
    const c = pod.containers.find((x) => x.name === "collectived");
    const file = c.env.find((e) => e.name === "COLLECTIVED_ADMIN_TOKEN_FILE")?.value;
    assert.ok(file, "COLLECTIVED_ADMIN_TOKEN_FILE");
    const mount = c.volumeMounts.find((m) => file.startsWith(m.mountPath + "/"));
    assert.ok(mount?.readOnly);
    assert.equal(pod.volumes.find((v) => v.name === mount.name).secret?.secretName, "collectived-admin-token");
  });

  test("trainer jobs present a job token read from a Secret file", () => {
    for (const dir of ["k8s/jobs/native-sidecar", "k8s/jobs/daemonset-trainer"]) {
      const pod = find(dir, "Job").spec.template.spec;
      const trainer = pod.containers.find((c) => c.name === "trainer");
      const file = trainer.env.find((e) => e.name === "COLLECTIVED_JOB_TOKEN_FILE")?.value;
      assert.ok(file, `${dir}: COLLECTIVED_JOB_TOKEN_FILE`);
      assert.ok(!trainer.env.some((e) => e.name === "COLLECTIVED_JOB_TOKEN"), "never a plain value in the manifest");
      const mount = trainer.volumeMounts.find((m) => file.startsWith(m.mountPath + "/"));
      assert.ok(mount?.readOnly, `${dir}: the token's directory is mounted read-only`);
      const volume = pod.volumes.find((v) => v.name === mount.name);
      assert.match(volume.secret?.secretName ?? "", /-job-token$/, `${dir}: from a Secret`);
      assert.equal(pod.securityContext.fsGroup, 10001, `${dir}: the token file is readable by the trainer's group`);
    }
  });

  test("NetworkPolicy of the job admits only pods of the same job (and Prometheus on metrics)", () => {
    const job = find("k8s/jobs/native-sidecar", "Job");
    const np = find("k8s/jobs/native-sidecar", "NetworkPolicy");
    const jobLabel = { "batch.kubernetes.io/job-name": job.metadata.name };
    assert.deepEqual(np.spec.podSelector.matchLabels, jobLabel);
    assert.deepEqual(np.spec.policyTypes, ["Ingress"]);
    for (const rule of np.spec.ingress) {
      for (const from of rule.from) {
        if (from.podSelector) {
          assert.deepEqual(from.podSelector.matchLabels, jobLabel);
          assert.ok(!from.namespaceSelector);
        } else {
          assert.ok(from.namespaceSelector, "other sources are namespaces (monitoring)");
          assert.deepEqual(rule.ports.map((p) => p.port), ["metrics"], "and only on the metrics port");
        }
      }
    }
  });

  test("Service selectors and PodMonitor selector match pods", () => {
    for (const [dir, docs] of rendered) {
      const templates = docs.filter((d) => d.spec?.template?.metadata)
        .map((d) => ({ ...d.spec.template.metadata.labels, ...(d.kind === "Job" ? { "batch.kubernetes.io/job-name": d.metadata.name } : {}) }));
      for (const svc of docs.filter((d) => d.kind === "Service")) {
        const sel = Object.entries(svc.spec.selector);
        assert.ok(templates.some((labels) => sel.every(([k, v]) => labels[k] === v)),
          `${dir}: Service/${svc.metadata.name} selects no pod of its kustomization`);
        assert.equal(svc.spec.clusterIP, "None", "headless");
      }
    }
    const pm = find("k8s/overlays/daemonset", "PodMonitor");
    const ds = find("k8s/overlays/daemonset", "DaemonSet");
    const job = find("k8s/jobs/native-sidecar", "Job");
    for (const labels of [ds.spec.template.metadata.labels, job.spec.template.metadata.labels]) {
      assert.ok(Object.entries(pm.spec.selector.matchLabels).every(([k, v]) => labels[k] === v));
    }
    assert.equal(pm.spec.podMetricsEndpoints[0].port, "metrics");
  });

  test("images carry a tag", () => {
    for (const [dir, docs] of rendered) {
      for (const d of docs) {
        const spec = d.spec?.template?.spec;
        if (!spec) continue;
        for (const c of [...(spec.initContainers ?? []), ...spec.containers]) {
          assert.match(c.image, /:[\w.-]+$/, `${dir}: ${d.kind}/${d.metadata.name} ${c.name}`);
        }
      }
    }
  });
});

describe("broken manifests fail validation", () => {
  const dir = path.join(here, "broken");
  for (const name of fs.readdirSync(dir).filter((f) => f.endsWith(".yaml")).sort()) {
    test(`broken/${name} is rejected`, () => {
      const file = path.join(dir, name);
      // One or more "# expect: ..." lines: every one must appear in the output.
      const expects = [...fs.readFileSync(file, "utf8").matchAll(/^# expect: (.*)$/gm)].map((m) => m[1]);
      assert.ok(expects.length > 0, "the file says what it expects (# expect: ...)");
      // Through the command line a user would run, not the library.
      const r = spawnSync(process.execPath, [path.join(here, "validate-file.mjs"), file], { encoding: "utf8" });
      assert.equal(r.status, 1, `must fail:\n${r.stdout}${r.stderr}`);
      for (const expect of expects) assert.ok(r.stdout.includes(expect), `expected "${expect}" in:\n${r.stdout}`);
    });
  }
  test("valid manifests pass the same command", () => {
    for (const file of ["base/daemonset.yaml", "jobs/daemonset-trainer/job.yaml", "jobs/native-sidecar/job.yaml"]) {
      const r = spawnSync(process.execPath, [path.join(here, "validate-file.mjs"),
        path.join(k8sDir, file)], { encoding: "utf8" });
      assert.equal(r.status, 0, r.stdout + r.stderr);
    }
  });
});

describe("Prometheus and Grafana", () => {
  const promDir = path.join(k8sDir, "prometheus");
  const rulesFile = path.join(promDir, "rules.yml");
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), "collectived-k8s-"));
  const check = (args, opts) => {
    const r = promtool(args, opts);
    if (r.error) assert.fail(`promtool: ${r.error.message} (Debian package "prometheus")`);
    return r;
  };

  test("promtool check rules k8s/prometheus/rules.yml", () => {
    const r = check(["check", "rules", rulesFile]);
    assert.equal(r.status, 0, r.stdout + r.stderr);
  });

  test("the PrometheusRule holds exactly the rules of rules.yml and passes promtool", () => {
    const [rule] = parseDocuments(fs.readFileSync(path.join(k8sDir, "components/monitoring/prometheusrule.yaml"), "utf8"));
    const plain = YAML.parse(fs.readFileSync(rulesFile, "utf8"));
    assert.deepEqual(rule.spec.groups, plain.groups, "k8s/components/monitoring/prometheusrule.yaml and k8s/prometheus/rules.yml differ");
    const file = path.join(tmp, "prometheusrule-spec.yml");
    fs.writeFileSync(file, YAML.stringify(rule.spec));
    const r = check(["check", "rules", file]);
    assert.equal(r.status, 0, r.stdout + r.stderr);
  });

  test("promtool check config k8s/prometheus/prometheus.yml", (t) => {
    let r = check(["check", "config", "prometheus.yml"], { cwd: promDir });
    if (r.status !== 0 && /field kubernetes_sd_configs not found/.test(r.stdout + r.stderr)) {
      // Debian builds Prometheus without Kubernetes service discovery: check everything else
      // (relabelling included) with the kubernetes_sd_configs blocks replaced by static targets.
      t.diagnostic("Debian's promtool has no kubernetes_sd_configs: that block is checked as static_configs");
      const cfg = YAML.parse(fs.readFileSync(path.join(promDir, "prometheus.yml"), "utf8"));
      for (const job of cfg.scrape_configs) {
        if (job.kubernetes_sd_configs) {
          assert.deepEqual(job.kubernetes_sd_configs, [{ role: "pod" }]);
          delete job.kubernetes_sd_configs;
          job.static_configs = [{ targets: ["pod.example:9490"] }];
        }
      }
      fs.copyFileSync(rulesFile, path.join(tmp, "rules.yml"));
      fs.writeFileSync(path.join(tmp, "prometheus.yml"), YAML.stringify(cfg));
      r = check(["check", "config", "prometheus.yml"], { cwd: tmp });
    }
    assert.equal(r.status, 0, r.stdout + r.stderr);
  });

  const dashboardFile = path.join(k8sDir, "grafana/collectived-dashboard.json");
  const dashboard = JSON.parse(fs.readFileSync(dashboardFile, "utf8"));
  const exprs = dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => ({ panel: p.title, expr: t.expr })));

  test("Grafana dashboard: structure", () => {
    assert.ok(dashboard.uid && dashboard.title && dashboard.schemaVersion);
    const ids = dashboard.panels.map((p) => p.id);
    assert.equal(new Set(ids).size, ids.length, "panel ids are unique");
    for (const p of dashboard.panels) {
      assert.ok(p.gridPos, `${p.title}: gridPos`);
      if (p.type !== "row") assert.equal(p.datasource.uid, "${datasource}", `${p.title}: datasource variable`);
    }
    const titles = dashboard.panels.map((p) => p.title.toLowerCase()).join(" | ");
    for (const want of ["bus bandwidth", "latency quantiles", "in-flight op age", "stragglers per group"]) {
      assert.ok(titles.includes(want), `a panel about ${want}`);
    }
  });

  test("Grafana dashboard: every query parses (promtool, as recording rules)", () => {
    const rules = exprs.map((e, i) => ({
      record: `dashboard:query_${i}`,
      expr: e.expr.replaceAll("$__rate_interval", "5m").replaceAll("$__range", "1h")
        .replaceAll("$namespace", ".*").replaceAll("$group", ".*"),
    }));
    const file = path.join(tmp, "dashboard-queries.yml");
    fs.writeFileSync(file, YAML.stringify({ groups: [{ name: "dashboard", rules }] }));
    const r = check(["check", "rules", file]);
    assert.equal(r.status, 0, r.stdout + r.stderr);
  });

  test("every collectived_* metric of the rules and the dashboard is exported by the daemon", (t) => {
    const exported = exportedMetricNames();
    if (!exported) return t.skip("services/collectived/metrics.cc not found");
    const used = new Set([...metricNames(fs.readFileSync(rulesFile, "utf8")),
      ...exprs.flatMap((e) => [...metricNames(e.expr)])]);
    const missing = [...used].filter((m) => !exported.has(m));
    assert.deepEqual(missing, [], "used in k8s/prometheus/rules.yml or the dashboard but not in services/collectived/metrics.cc");
  });
});
