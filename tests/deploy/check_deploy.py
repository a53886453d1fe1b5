#!/usr/bin/python3
"""Static checks of deploy/: the systemd units and the Kubernetes manifests.

Units: `systemd-analyze verify` on each (the ExecStart binary rewritten to
the built launcher, which must exist), failing on anything it says about
them; the directives a node and a gateway rely on; the flags their
commands pass, with the example env files substituted; the etcd example
against `etcd --help`. Manifests (no Kubernetes cluster on our machines):
kinds and API versions, selectors and labels, volumes and mounts, `$(VAR)`
references, the flags each launcher container passes, every Secret and
ConfigMap named defined here or created in deploy/kubernetes/README.md,
and what the node DaemonSet and the gateway Deployment must have.

    STRATA_BUILD_DIR=build /usr/bin/python3 tests/deploy/check_deploy.py
    /usr/bin/python3 tests/deploy/check_deploy.py --launcher build/launcher/launcher
"""

import argparse
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SYSTEMD = DEPLOY / "systemd"
KUBERNETES = DEPLOY / "kubernetes"
INSTALLED_LAUNCHER = "/usr/local/bin/launcher"
DEBIAN_ETCD_UNIT = Path("/lib/systemd/system/etcd.service")
ETCD = Path("/usr/bin/etcd")


class Verb:
    def __init__(self, allowed, required=(), repeatable=(), switches=()):
        self.allowed = set(allowed) | set(switches)
        self.required = set(required)
        self.repeatable = set(repeatable)
        self.switches = set(switches)


# The commands the units and manifests may run, with exactly these flags
# (docs/operations.md, "Deployment").
VERBS = {
    "serve": Verb(
        ["--state", "--socket", "--listen", "--tls-cert", "--tls-key", "--tokens", "--store",
         "--max-sandboxes", "--memory-reserve", "--node", "--cluster", "--label", "--advertise"],
        required=["--state", "--socket", "--listen", "--tls-cert", "--tls-key", "--tokens", "--store",
                  "--max-sandboxes", "--memory-reserve", "--node", "--cluster"],
        repeatable=["--label", "--listen", "--store"]),
    "gateway": Verb(
        ["--cluster", "--listen", "--tls-cert", "--tls-key", "--tokens", "--node-token", "--node-ca",
         "--overflow", "--overflow-threshold"],
        required=["--cluster", "--listen", "--tls-cert", "--tls-key", "--tokens", "--node-token"],
        repeatable=["--listen"]),
    "doctor": Verb([], required=["--fix"], switches=["--fix"]),
}
FILE_FLAGS = ["--tls-cert", "--tls-key", "--tokens", "--node-token", "--node-ca"]
# Files the daemons refuse when their mode has group or other bits.
SECRET_FILE_FLAGS = ["--tokens", "--node-token"]
# Read by `launcher serve` and its lazyfs from the environment.
NODE_ENV = ["STRATA_RUN_DIR", "STRATA_UPPERS", "STRATA_LAZYFS_SOCKET", "STRATA_CACHE", "STRATA_CGROUP_PARENT"]

problems = []


def fail(where, message):
    problems.append(f"{where}: {message}")


# ---------------------------------------------------------------- flags

VALUE_CHECKS = {
    "--cluster": (re.compile(r"^https?://[^\s/,]+/?(,https?://[^\s/,]+/?)*$"), "a list of http(s) URLs"),
    "--listen": (re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9.-]+):\d+$"), "HOST:PORT"),
    "--advertise": (re.compile(r"^https://[^\s/]+:\d+$"), "https://HOST:PORT"),
    "--label": (re.compile(r"^[A-Za-z0-9._/-]+=[A-Za-z0-9._-]*$"), "K=V"),
    "--overflow": (re.compile(r"^[A-Za-z0-9._/-]+=[A-Za-z0-9._-]*$"), "K=V"),
    "--max-sandboxes": (re.compile(r"^[1-9]\d*$"), "a positive count"),
    "--memory-reserve": (re.compile(r"^\d+[KMGT]?$"), "a size (K, M, G, T)"),
    "--overflow-threshold": (re.compile(r"^(0(\.\d+)?|1(\.0+)?)$"), "a fraction 0-1"),
}


def check_launcher_argv(where, argv):
    """argv: what follows the launcher binary, variables substituted where
    known ($(X) left where not). Returns {flag: [values]}."""
    if not argv or argv[0] not in VERBS:
        fail(where, f"launcher verb {argv[0] if argv else '(none)'!r} is none of {sorted(VERBS)}")
        return {}
    verb = VERBS[argv[0]]
    flags = {}
    i = 1
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            fail(where, f"launcher {argv[0]}: unexpected argument {arg!r}")
            i += 1
            continue
        name, eq, value = arg.partition("=")
        if name not in verb.allowed:
            fail(where, f"launcher {argv[0]}: flag {name} is not one of {sorted(verb.allowed)}")
        if name in verb.switches:
            if eq:
                fail(where, f"launcher {argv[0]}: {name} takes no value")
            flags.setdefault(name, []).append(None)
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                fail(where, f"launcher {argv[0]}: {name} has no value")
                i += 1
                continue
            value = argv[i + 1]
            i += 2
        else:
            i += 1
        flags.setdefault(name, []).append(value)
    for name, values in flags.items():
        if len(values) > 1 and name not in verb.repeatable:
            fail(where, f"launcher {argv[0]}: {name} given {len(values)} times")
        for value in values:
            if value is None or "$(" in value or name not in VALUE_CHECKS:
                continue
            pattern, what = VALUE_CHECKS[name]
            if not pattern.match(value):
                fail(where, f"launcher {argv[0]}: {name} {value!r} is not {what}")
    for name in sorted(verb.required - set(flags)):
        fail(where, f"launcher {argv[0]}: {name} is missing")
    return flags


# ---------------------------------------------------------------- systemd

def parse_unit(path):
    """{section: [(key, value)]}, continuation lines joined."""
    sections, section, pending = {}, None, ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if pending and line and line[0] in "#;":
            continue  # comments inside a continued line are skipped, as systemd does
        line = pending + line
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            sections.setdefault(section, [])
            continue
        key, _, value = line.partition("=")
        sections.setdefault(section, []).append((key.strip(), value.strip()))
    return sections


def values(unit, section, key):
    return [v for k, v in unit.get(section, []) if k == key]


def one(unit, section, key):
    v = values(unit, section, key)
    return v[-1] if v else None


def parse_env_file(path):
    env = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        key, eq, value = line.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            fail(path.name, f"not KEY=VALUE: {raw!r}")
            continue
        env[key] = value
    return env


def expand_command(where, command, env):
    """systemd's expansion: ${X} one word, $X split at whitespace."""
    words, used = [], set()
    for token in shlex.split(command):
        whole = re.fullmatch(r"\$(\w+)", token)
        if whole:
            used.add(whole.group(1))
            if whole.group(1) not in env and whole.group(1) != "MAINPID":
                fail(where, f"${whole.group(1)} is not set in the example env file")
            words += env.get(whole.group(1), "").split()
            continue

        def sub(m):
            used.add(m.group(1))
            if m.group(1) not in env:
                fail(where, f"${{{m.group(1)}}} is not set in the example env file")
            return env.get(m.group(1), "")
        words.append(re.sub(r"\$\{(\w+)\}", sub, token))
    return words, used


def check_unit_env(name, unit):
    """The example env file of the unit's EnvironmentFile, its variables used."""
    env_files = values(unit, "Service", "EnvironmentFile")
    ours = [f for f in env_files if f.startswith("/etc/strata/")]
    if len(ours) != 1:
        fail(name, f"expected one EnvironmentFile under /etc/strata/, found {env_files}")
        return {}, Path()
    example = SYSTEMD / (Path(ours[0]).name + ".example")
    if not example.is_file():
        fail(name, f"EnvironmentFile {ours[0]} has no example {example.name}")
        return {}, example
    return parse_env_file(example), example


def check_node_unit(unit):
    name = "strata-node.service"
    service = dict(unit.get("Service", []))
    expect = {"KillMode": "process", "Delegate": "yes", "Restart": "always", "TasksMax": "infinity"}
    for key, want in expect.items():
        if one(unit, "Service", key) != want:
            fail(name, f"{key}={one(unit, 'Service', key)}, want {want}")
    nofile = one(unit, "Service", "LimitNOFILE") or ""
    if not (nofile == "infinity" or nofile.isdigit() and int(nofile) >= 65536):
        fail(name, f"LimitNOFILE={nofile or '(unset)'}: thousands of sandboxes need 65536 or more")
    for key in ("After", "Wants"):
        if "network-online.target" not in " ".join(values(unit, "Unit", key)).split():
            fail(name, f"{key}= lacks network-online.target")
    if "User" in service and service["User"] not in ("", "root"):
        fail(name, "the node daemon runs as root")
    # The daemon's mounts and interfaces must be the host's.
    for key in ("PrivateTmp", "PrivateMounts", "PrivateDevices", "PrivateNetwork", "ProtectSystem",
                "ProtectHome", "ProtectKernelModules", "ProtectControlGroups", "ReadOnlyPaths",
                "ReadWritePaths", "InaccessiblePaths", "TemporaryFileSystem", "BindPaths",
                "BindReadOnlyPaths", "RootDirectory", "RootImage", "MountFlags", "NetworkNamespacePath",
                "NoNewPrivileges", "CapabilityBoundingSet", "DynamicUser"):
        if key in service:
            fail(name, f"{key}= would take the daemon out of the host's namespaces or rights")
    env, example = check_unit_env(name, unit)
    used = set()
    pre = [shlex.split(v) for v in values(unit, "Service", "ExecStartPre")]
    if [INSTALLED_LAUNCHER, "doctor", "--fix"] not in pre:
        fail(name, f"no ExecStartPre={INSTALLED_LAUNCHER} doctor --fix")
    for key in ("ExecStartPre", "ExecStart", "ExecReload"):
        for command in values(unit, "Service", key):
            words, u = expand_command(f"{name} {key}", command, env)
            used |= u
            if words and words[0] == INSTALLED_LAUNCHER:
                flags = check_launcher_argv(f"{name} {key}", words[1:])
                if key == "ExecStart" and words[1:2] != ["serve"]:
                    fail(name, "ExecStart does not run launcher serve")
                if key == "ExecStart":
                    check_unit_files(name, flags)
    for var in NODE_ENV:
        if var not in env:
            fail(example.name, f"{var} is not set")
    for var in env:
        if var not in used and var not in NODE_ENV:
            fail(example.name, f"{var} is set but neither the unit nor the daemon reads it")
    return env


def check_gateway_unit(unit):
    name = "strata-gateway.service"
    expect = {"NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes",
              "ProtectHome": "yes", "Restart": "always"}
    for key, want in expect.items():
        if one(unit, "Service", key) != want:
            fail(name, f"{key}={one(unit, 'Service', key)}, want {want}")
    user = one(unit, "Service", "User")
    if not (user and user != "root" or one(unit, "Service", "DynamicUser") == "yes"):
        fail(name, "the gateway runs as a user of its own (User= or DynamicUser=yes)")
    if one(unit, "Service", "CapabilityBoundingSet") not in ("", "~"):
        caps = one(unit, "Service", "CapabilityBoundingSet")
        if caps is None or "CAP_SYS_ADMIN" in caps:
            fail(name, f"CapabilityBoundingSet={caps}: the gateway needs no capabilities")
    if one(unit, "Service", "KillMode") not in (None, "control-group"):
        fail(name, "a stateless gateway is stopped whole (KillMode control-group)")
    env, example = check_unit_env(name, unit)
    used = set()
    for key in ("ExecStart", "ExecReload", "ExecStartPre"):
        for command in values(unit, "Service", key):
            words, u = expand_command(f"{name} {key}", command, env)
            used |= u
            if key == "ExecStart":
                if words[:2] != [INSTALLED_LAUNCHER, "gateway"]:
                    fail(name, "ExecStart does not run launcher gateway")
                check_unit_files(name, check_launcher_argv(f"{name} ExecStart", words[1:]))
    for var in env:
        if var not in used:
            fail(example.name, f"{var} is set but the unit does not use it")
    return env


def check_unit_files(name, flags):
    for flag in FILE_FLAGS:
        for value in flags.get(flag, []):
            if not value.startswith("/etc/strata/"):
                fail(name, f"{flag} {value}: keep the files under /etc/strata/")


def check_etcd_env(path, node_env, gateway_env):
    env = parse_env_file(path)
    where = path.name
    check_etcd_variables(where, env)
    members = dict(m.split("=", 1) for m in env.get("ETCD_INITIAL_CLUSTER", "").split(",") if "=" in m)
    if len(members) != 3:
        fail(where, f"ETCD_INITIAL_CLUSTER names {len(members)} members, want 3")
    if env.get("ETCD_NAME") not in members:
        fail(where, f"ETCD_NAME {env.get('ETCD_NAME')} is not in ETCD_INITIAL_CLUSTER")
    elif members[env["ETCD_NAME"]] != env.get("ETCD_INITIAL_ADVERTISE_PEER_URLS"):
        fail(where, "ETCD_INITIAL_ADVERTISE_PEER_URLS differs from this member's ETCD_INITIAL_CLUSTER entry")
    peer_hosts = {re.sub(r"^\w+://|:\d+$", "", u) for u in members.values()}
    for example, env_vars, var in (("node.env.example", node_env, "NODE_CLUSTER"),
                                   ("gateway.env.example", gateway_env, "GATEWAY_CLUSTER")):
        urls = env_vars.get(var, "").split(",")
        hosts = {re.sub(r"^\w+://|:\d+$", "", u) for u in urls}
        if hosts != peer_hosts:
            fail(example, f"{var} names {sorted(hosts)}, the etcd members are {sorted(peer_hosts)}")
        if env.get("ETCD_ADVERTISE_CLIENT_URLS") not in urls:
            fail(example, f"{var} lacks the example member's client URL {env.get('ETCD_ADVERTISE_CLIENT_URLS')}")


@functools.cache
def etcd_flags():
    """The flags and version of Debian's etcd, or None without it."""
    if not ETCD.exists():
        return None
    def run(flag):
        r = subprocess.run([str(ETCD), flag], capture_output=True, text=True)
        return r.stdout + r.stderr
    help_text = run("--help")
    version = re.search(r"etcd Version: (\S+)", run("--version"))
    return set(re.findall(r"^\s+(--[a-z0-9-]+)", help_text, re.M)), version.group(1) if version else "?"


def check_etcd_variables(where, env):
    """Each ETCD_X is etcd's flag --x (etcd warns about others and ignores them)."""
    if etcd_flags() is None:
        return  # verify_units says etcd is missing
    flags, version = etcd_flags()
    for var in env:
        flag = "--" + var[len("ETCD_"):].lower().replace("_", "-")
        if var.startswith("ETCD_") and flag not in flags:
            fail(where, f"{var}: etcd {version} has no flag {flag}")


def verify_units(launcher):
    analyze = shutil.which("systemd-analyze") or ("/usr/bin/systemd-analyze"
                                                  if os.access("/usr/bin/systemd-analyze", os.X_OK) else None)
    if not analyze:
        fail("systemd-analyze", "not found: it comes with Debian's systemd package (scripts/setup installs it)")
        return
    if not DEBIAN_ETCD_UNIT.is_file() or not ETCD.exists():
        fail("etcd", f"{DEBIAN_ETCD_UNIT} or {ETCD} is missing: install Debian's etcd-server (scripts/setup)")
    # Each unit in a directory of its own, first in the unit path (so a
    # drop-in beside it is found), the system's after it.
    units = [("strata-node.service", None), ("strata-gateway.service", None)]
    if DEBIAN_ETCD_UNIT.is_file():
        units.append(("etcd.service", "etcd.service.d"))
    for name, dropins in units:
        with tempfile.TemporaryDirectory(prefix="strata-deploy-") as tmp:
            unit = Path(tmp) / name
            if name == "etcd.service":
                shutil.copy(DEBIAN_ETCD_UNIT, unit)
            else:
                unit.write_text((SYSTEMD / name).read_text().replace(INSTALLED_LAUNCHER, str(launcher)))
            if dropins:
                shutil.copytree(SYSTEMD / dropins, Path(tmp) / dropins)
            env = dict(os.environ, SYSTEMD_UNIT_PATH=f"{tmp}:", SYSTEMD_LOG_COLOR="0")
            r = subprocess.run([analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, env=env)
            output = [l.replace(tmp, "deploy/systemd") for l in (r.stdout + r.stderr).splitlines() if l.strip()]
        # Lines about other units (the system's) are shown, not counted.
        ours = [l for l in output if "deploy/systemd" in l or name in l or "strata" in l]
        for line in output:
            print(f"  systemd-analyze verify {name}: {line}")
        for line in ours:
            fail(f"systemd-analyze verify {name}", line)
        if r.returncode != 0 and not ours:
            fail(f"systemd-analyze verify {name}", f"exit status {r.returncode}")
        if not output and r.returncode == 0:
            print(f"  systemd-analyze verify {name}: clean")


# ---------------------------------------------------------------- Kubernetes

API_VERSIONS = {"Namespace": "v1", "ConfigMap": "v1", "Secret": "v1", "Service": "v1",
                "DaemonSet": "apps/v1", "Deployment": "apps/v1", "StatefulSet": "apps/v1",
                "PodDisruptionBudget": "policy/v1"}
WORKLOADS = ("DaemonSet", "Deployment", "StatefulSet")
FIELD_PATHS = {"metadata.name", "metadata.namespace", "spec.nodeName", "status.hostIP", "status.podIP",
               "spec.serviceAccountName"}


def documented_objects():
    """{(kind, name): keys} created by `kubectl create` in the README."""
    text = (KUBERNETES / "README.md").read_text().replace("\\\n", " ")
    objects = {}
    for line in text.splitlines():
        m = re.search(r"kubectl\b.*\bcreate\s+(secret\s+(generic|tls)|configmap)\s+([a-z0-9.-]+)(.*)", line)
        if not m:
            continue
        kind = "ConfigMap" if m.group(1) == "configmap" else "Secret"
        keys = set(re.findall(r"--from-literal=([A-Za-z0-9._-]+)=", m.group(4)))
        for source in re.findall(r"--from-file=(\S+)", m.group(4)):
            keys.add(source.split("=", 1)[0] if "=" in source else os.path.basename(source))
        if m.group(2) == "tls":
            keys |= {"tls.crt", "tls.key"}
        objects[(kind, m.group(3))] = keys
    return objects


class Manifests:
    def __init__(self):
        self.objects = []  # (file, doc)
        for path in sorted(KUBERNETES.glob("*.yaml")):
            try:
                docs = list(yaml.safe_load_all(path.read_text()))
            except yaml.YAMLError as e:
                fail(path.name, f"YAML: {e}")
                continue
            for doc in docs:
                if doc is None:
                    continue
                if not isinstance(doc, dict):
                    fail(path.name, "a document that is not a mapping")
                    continue
                self.objects.append((path.name, doc))
        self.documented = documented_objects()

    def of_kind(self, *kinds):
        return [(f, d) for f, d in self.objects if d.get("kind") in kinds]

    def find(self, kind, name):
        for _, d in self.objects:
            if d.get("kind") == kind and d.get("metadata", {}).get("name") == name:
                return d
        return None


def where_of(file, doc, extra=""):
    return f"{file} {doc.get('kind')}/{doc.get('metadata', {}).get('name')}{extra}"


def pod_template(doc):
    return doc.get("spec", {}).get("template", {})


def containers(pod_spec):
    return [("initContainer", c) for c in pod_spec.get("initContainers", []) or []] + \
           [("container", c) for c in pod_spec.get("containers", []) or []]


def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_reference(m, where, kind, name, key=None):
    obj = m.find(kind, name)
    if obj is not None:
        data = set(obj.get("data", {}) or {}) | set(obj.get("stringData", {}) or {})
        if key is not None and key not in data:
            fail(where, f"{kind} {name} has no key {key!r}")
        return None
    if (kind, name) in m.documented:
        if key is not None and key not in m.documented[(kind, name)]:
            fail(where, f"{kind} {name} (README.md) is made without key {key!r}")
        return None
    fail(where, f"{kind} {name} is neither in these manifests nor created in README.md")


def resolve_env(m, container):
    """({name: value, or None when known only at run time}, [issues])."""
    env, issues = {}, []
    for entry in container.get("env", []) or []:
        name = entry.get("name")
        if "value" in entry:
            value = str(entry["value"])
            for ref in re.findall(r"\$\((\w+)\)", value):
                if ref not in env:
                    issues.append(f"env {name}: $({ref}) is not defined above it")
            env[name] = re.sub(r"\$\((\w+)\)", lambda r: env.get(r.group(1)) or r.group(0), value)
            continue
        source = entry.get("valueFrom", {})
        env[name] = None
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            obj = m.find("ConfigMap", ref.get("name"))
            if obj is not None:
                env[name] = (obj.get("data") or {}).get(ref.get("key"))
        elif "fieldRef" in source and source["fieldRef"].get("fieldPath") not in FIELD_PATHS:
            issues.append(f"env {name}: fieldPath {source['fieldRef'].get('fieldPath')} is not one we use")
    return env, issues


def check_pod(m, file, doc):
    where = where_of(file, doc)
    spec = doc.get("spec", {})
    template = pod_template(doc)
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not labels_match(selector, labels):
        fail(where, f"selector {selector} does not match the pod labels {labels}")
    pod = template.get("spec", {})
    volumes = {v.get("name"): v for v in pod.get("volumes", []) or []}
    claim_names = {c.get("metadata", {}).get("name") for c in spec.get("volumeClaimTemplates", []) or []}
    mounted = set()
    for what, c in containers(pod):
        cwhere = f"{where} {what} {c.get('name')}"
        if not c.get("image"):
            fail(cwhere, "no image")
        env, issues = resolve_env(m, c)
        for issue in issues:
            fail(cwhere, issue)
        for entry in c.get("env", []) or []:
            source = entry.get("valueFrom", {})
            for kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                if key in source:
                    check_reference(m, cwhere, kind, source[key].get("name"), source[key].get("key"))
        for entry in c.get("envFrom", []) or []:
            for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if key in entry:
                    check_reference(m, cwhere, kind, entry[key].get("name"))
        for text in (c.get("command") or []) + (c.get("args") or []):
            for ref in re.findall(r"\$\((\w+)\)", str(text)):
                if ref not in env:
                    fail(cwhere, f"$({ref}) in the command is not in env")
        for mount in c.get("volumeMounts", []) or []:
            name = mount.get("name")
            mounted.add(name)
            if name not in volumes and name not in claim_names:
                fail(cwhere, f"volumeMount {name} names no volume")
        # A file a command names inside a Secret or ConfigMap is one of its keys.
        for text in (c.get("command") or []) + (c.get("args") or []):
            mount = mount_of(c, str(text)) if str(text).startswith("/") else None
            volume = volumes.get(mount.get("name"), {}) if mount else {}
            if mount and ("secret" in volume or "configMap" in volume):
                key = str(text)[len(mount["mountPath"].rstrip("/")) + 1:].split("/")[0]
                if "secret" in volume:
                    check_reference(m, cwhere, "Secret", volume["secret"].get("secretName"), key)
                else:
                    check_reference(m, cwhere, "ConfigMap", volume["configMap"].get("name"), key)
        names = [p.get("name") for p in c.get("ports", []) or []]
        if len(names) != len(set(names)):
            fail(cwhere, "two ports share a name")
    for name, v in volumes.items():
        if name not in mounted:
            fail(where, f"volume {name} is mounted nowhere")
        if "secret" in v:
            check_reference(m, where, "Secret", v["secret"].get("secretName"))
        if "configMap" in v:
            check_reference(m, where, "ConfigMap", v["configMap"].get("name"))
    for name in claim_names - mounted:
        fail(where, f"volumeClaimTemplate {name} is mounted nowhere")


def launcher_containers(doc):
    out = []
    pod = pod_template(doc).get("spec", {})
    for what, c in containers(pod):
        argv = list(c.get("command") or []) + [str(a) for a in c.get("args") or []]
        if argv and argv[0] == INSTALLED_LAUNCHER:
            out.append((what, c, argv[1:]))
    return out


def substitute(argv, env):
    return [re.sub(r"\$\((\w+)\)", lambda r: env.get(r.group(1)) or r.group(0), a) for a in argv]


def mount_of(container, path):
    """The volumeMount holding path (the longest prefix)."""
    best = None
    for mount in container.get("volumeMounts", []) or []:
        mp = mount.get("mountPath", "").rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best.get("mountPath", "")):
                best = mount
    return best


def run_as_user(pod, container):
    return (container.get("securityContext") or {}).get("runAsUser",
                                                       (pod.get("securityContext") or {}).get("runAsUser"))


def check_launcher_container(m, file, doc, what, c, argv):
    where = where_of(file, doc, f" {what} {c.get('name')}")
    env, _ = resolve_env(m, c)  # its issues are check_pod's
    flags = check_launcher_argv(where, substitute(argv, env))
    pod = pod_template(doc).get("spec", {})
    volumes = {v.get("name"): v for v in pod.get("volumes", []) or []}
    for flag in FILE_FLAGS + ["--state", "--socket"]:
        for value in flags.get(flag, []):
            mount = mount_of(c, value)
            if mount is None:
                fail(where, f"{flag} {value} is on no volume")
                continue
            volume = volumes.get(mount["name"], {})
            if flag in ("--state", "--socket") and "hostPath" not in volume:
                fail(where, f"{flag} {value} must be on the host (a hostPath) to outlive the pod")
            if flag not in SECRET_FILE_FLAGS:
                continue
            source = volume.get("secret") or volume.get("configMap")
            if source is not None:
                mode = source.get("defaultMode", 0o644)
                if mode & 0o077 or run_as_user(pod, c) not in (0, None) or \
                        (pod.get("securityContext") or {}).get("runAsNonRoot"):
                    fail(where, f"{flag} {value}: a secret volume's file is root's; mode {mode:04o} "
                                f"must have no group or other bits and the container run as root")
            elif "emptyDir" in volume:
                writers = [ic for ic in pod.get("initContainers", []) or []
                           if any(vm.get("name") == mount["name"] and not vm.get("readOnly")
                                  for vm in ic.get("volumeMounts", []) or [])]
                if not writers:
                    fail(where, f"{flag} {value}: no init container writes volume {mount['name']}")
            else:
                fail(where, f"{flag} {value}: on volume {mount['name']}, neither a secret nor a copy")
    return flags


def check_node_daemonset(file, doc, c, flags):
    where = where_of(file, doc)
    spec = doc.get("spec", {})
    pod = pod_template(doc).get("spec", {})
    for key, want in (("hostNetwork", True), ("hostPID", True), ("dnsPolicy", "ClusterFirstWithHostNet")):
        if pod.get(key) != want:
            fail(where, f"{key} is {pod.get(key)}, want {want}")
    if (spec.get("updateStrategy") or {}).get("type") != "OnDelete":
        fail(where, "updateStrategy must be OnDelete: a node is drained before its daemon restarts")
    volumes = {v.get("name"): v for v in pod.get("volumes", []) or []}
    host_paths = ["/dev/fuse", "/sys/fs/cgroup", "/var/lib/strata", "/run/strata", "/run/crun"]
    bidirectional = ["/sys/fs/cgroup", "/var/lib/strata", "/run/strata"]
    for what, container in containers(pod):
        cwhere = f"{where} {what} {container.get('name')}"
        argv = list(container.get("command") or []) + list(container.get("args") or [])
        if argv[:1] != [INSTALLED_LAUNCHER]:
            continue
        if not (container.get("securityContext") or {}).get("privileged"):
            fail(cwhere, "not privileged: mounts, /dev/fuse, cgroups and namespaces need it")
        mounts = {mt.get("mountPath"): mt for mt in container.get("volumeMounts", []) or []}
        for path in host_paths:
            mount = mounts.get(path)
            volume = volumes.get(mount.get("name")) if mount else None
            if not volume or (volume.get("hostPath") or {}).get("path") != path:
                fail(cwhere, f"{path} is not the host's (a hostPath mounted at the same path)")
            elif path in bidirectional and mount.get("mountPropagation") != "Bidirectional":
                fail(cwhere, f"{path}: mountPropagation must be Bidirectional, so its mounts are the host's")
        env_names = [e.get("name") for e in container.get("env", []) or []]
        for var in NODE_ENV:
            if var not in env_names:
                fail(cwhere, f"env {var} is missing")
        values_ = {e.get("name"): e.get("value") for e in container.get("env", []) or []}
        for var in ("STRATA_RUN_DIR", "STRATA_UPPERS", "STRATA_LAZYFS_SOCKET", "STRATA_CACHE"):
            value = values_.get(var)
            if value and not any(value == p or value.startswith(p + "/") for p in ("/run/strata", "/var/lib/strata")):
                fail(cwhere, f"{var}={value} is not under /run/strata or /var/lib/strata (the host's)")
    node = flags.get("--node", [None])[0]
    m_var = re.fullmatch(r"\$\((\w+)\)", node or "")
    field = None
    if m_var:
        for e in c.get("env", []) or []:
            if e.get("name") == m_var.group(1):
                field = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
    if field != "spec.nodeName":
        fail(where, f"--node {node} is not the Kubernetes node's name (fieldRef spec.nodeName)")
    doctors = [argv for what, _, argv in launcher_containers(doc) if what == "initContainer"]
    if ["doctor", "--fix"] not in doctors:
        fail(where, "no init container runs launcher doctor --fix")


def check_gateway_deployment(file, doc, c, flags):
    where = where_of(file, doc)
    pod = pod_template(doc).get("spec", {})
    psc = pod.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            fail(where, f"{key}: the gateway is unprivileged")
    for what, container in containers(pod):
        cwhere = f"{where} {what} {container.get('name')}"
        sc = container.get("securityContext") or {}
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot"))):
            fail(cwhere, "runAsNonRoot is not set")
        if run_as_user(pod, container) in (None, 0):
            fail(cwhere, "runAsUser must be a non-root uid (runAsNonRoot alone trusts the image)")
        if sc.get("privileged") or sc.get("allowPrivilegeEscalation", True):
            fail(cwhere, "privileged, or allowPrivilegeEscalation not false")
        if not sc.get("readOnlyRootFilesystem"):
            fail(cwhere, "readOnlyRootFilesystem is not true")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            fail(cwhere, "capabilities are not all dropped")
    resources = c.get("resources") or {}
    if not (resources.get("requests") and resources.get("limits")):
        fail(where, "the gateway container needs resource requests and limits")
    probe = (c.get("readinessProbe") or {}).get("httpGet") or {}
    if probe.get("path") != "/v1/health" or probe.get("scheme") != "HTTPS":
        fail(where, "readinessProbe is not GET /v1/health over HTTPS")
    port = probe.get("port")
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", []) or []}
    number = ports.get(port, port)
    listens = [l.rsplit(":", 1)[-1] for l in flags.get("--listen", [])]
    if str(number) not in listens:
        fail(where, f"readinessProbe port {port} is not a --listen port {listens}")


def check_services(m):
    workloads = [(f, d) for f, d in m.of_kind(*WORKLOADS)]
    for file, svc in m.of_kind("Service"):
        where = where_of(file, svc)
        selector = svc.get("spec", {}).get("selector") or {}
        matched = [(f, d) for f, d in workloads
                   if d["metadata"].get("namespace") == svc["metadata"].get("namespace")
                   and labels_match(selector, (pod_template(d).get("metadata") or {}).get("labels") or {})]
        if not matched:
            fail(where, f"selector {selector} matches no workload")
            continue
        for port in svc.get("spec", {}).get("ports", []) or []:
            target = port.get("targetPort", port.get("port"))
            found = False
            for _, d in matched:
                for _, c in containers(pod_template(d).get("spec", {})):
                    for p in c.get("ports", []) or []:
                        if target in (p.get("name"), p.get("containerPort")):
                            found = True
            if not found:
                fail(where, f"port {port.get('name')}: targetPort {target} is no container port")
    for file, sts in m.of_kind("StatefulSet"):
        svc = m.find("Service", sts.get("spec", {}).get("serviceName"))
        if svc is None or svc.get("spec", {}).get("clusterIP") != "None":
            fail(where_of(file, sts), "serviceName names no headless Service")
    for file, pdb in m.of_kind("PodDisruptionBudget"):
        selector = (pdb.get("spec", {}).get("selector") or {}).get("matchLabels") or {}
        if not any(labels_match(selector, (pod_template(d).get("metadata") or {}).get("labels") or {})
                   for _, d in workloads):
            fail(where_of(file, pdb), f"selector {selector} matches no workload")


def check_etcd_statefulset(m):
    for file, sts in m.of_kind("StatefulSet"):
        pod = pod_template(sts).get("spec", {})
        etcd = [c for _, c in containers(pod) if "etcd" in c.get("image", "")]
        if not etcd:
            continue
        where = where_of(file, sts)
        c = etcd[0]
        if not re.search(r":v3\.4\.\d+$", c["image"]):
            fail(where, f"image {c['image']}: the cluster is built against etcd 3.4 (Debian 12's)")
        replicas = sts["spec"].get("replicas")
        if replicas != 3:
            fail(where, f"replicas {replicas}, want 3")
        name, ns, svc = sts["metadata"]["name"], sts["metadata"].get("namespace"), sts["spec"].get("serviceName")
        env = {e["name"]: str(e.get("value", "")) for e in c.get("env", []) or []}
        check_etcd_variables(where, env)
        service = m.find("Service", svc) or {}
        ports = {p.get("name"): p.get("port") for p in service.get("spec", {}).get("ports", []) or []}
        members = [f"{name}-{i}" for i in range(replicas or 0)]
        want_cluster = ",".join(f"{n}=http://{n}.{svc}.{ns}.svc:{ports.get('peer')}" for n in members)
        if env.get("ETCD_INITIAL_CLUSTER") != want_cluster:
            fail(where, f"ETCD_INITIAL_CLUSTER is not the members' peer URLs ({want_cluster})")
        want_endpoints = ",".join(f"http://{n}.{svc}.{ns}.svc:{ports.get('client')}" for n in members)
        cluster = m.find("ConfigMap", "strata-cluster")
        if cluster is None or (cluster.get("data") or {}).get("etcd-endpoints") != want_endpoints:
            fail(where, f"ConfigMap strata-cluster etcd-endpoints is not the members' client URLs ({want_endpoints})")


def check_kubernetes():
    m = Manifests()
    if not m.objects:
        fail("deploy/kubernetes", "no manifests")
        return m
    namespaces = [d["metadata"].get("name") for _, d in m.of_kind("Namespace")]
    if len(namespaces) != 1:
        fail("deploy/kubernetes", f"want one Namespace, found {namespaces}")
    seen = set()
    for file, doc in m.objects:
        kind = doc.get("kind")
        where = where_of(file, doc)
        if kind not in API_VERSIONS:
            fail(where, f"kind {kind} is not one we deploy")
            continue
        if doc.get("apiVersion") != API_VERSIONS[kind]:
            fail(where, f"apiVersion {doc.get('apiVersion')}, want {API_VERSIONS[kind]}")
        meta = doc.get("metadata") or {}
        if not meta.get("name"):
            fail(where, "no metadata.name")
        if kind != "Namespace" and meta.get("namespace") not in namespaces:
            fail(where, f"namespace {meta.get('namespace')} is not the one defined ({namespaces})")
        if (kind, meta.get("name")) in seen:
            fail(where, "defined twice")
        seen.add((kind, meta.get("name")))
        if kind in WORKLOADS:
            check_pod(m, file, doc)
    check_services(m)
    check_etcd_statefulset(m)
    images = {c.get("image") for _, d in m.of_kind(*WORKLOADS)
              for _, c in containers(pod_template(d).get("spec", {})) if "etcd" not in c.get("image", "")}
    if len(images) != 1:
        fail("deploy/kubernetes", f"node and gateway containers should share one image, found {sorted(images)}")
    verbs = {}
    for file, doc in m.of_kind(*WORKLOADS):
        for what, c, argv in launcher_containers(doc):
            flags = check_launcher_container(m, file, doc, what, c, argv)
            verb = argv[0] if argv else None
            if verb == "serve":
                if doc.get("kind") != "DaemonSet":
                    fail(where_of(file, doc), "launcher serve runs in a DaemonSet, one per machine")
                check_node_daemonset(file, doc, c, flags)
            elif verb == "gateway":
                if doc.get("kind") != "Deployment":
                    fail(where_of(file, doc), "launcher gateway runs in a Deployment")
                check_gateway_deployment(file, doc, c, flags)
            verbs.setdefault(verb, []).append(where_of(file, doc))
    for verb in ("serve", "gateway"):
        if len(verbs.get(verb, [])) != 1:
            fail("deploy/kubernetes", f"want one workload running launcher {verb}, found {verbs.get(verb, [])}")
    return m


# ---------------------------------------------------------------- main

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launcher", help="the built launcher (default: $STRATA_BUILD_DIR/launcher/launcher)")
    parser.add_argument("--deploy", type=Path, default=DEPLOY, help="the deploy/ folder to check (default: this checkout's)")
    args = parser.parse_args()
    global SYSTEMD, KUBERNETES
    SYSTEMD, KUBERNETES = args.deploy / "systemd", args.deploy / "kubernetes"
    launcher = args.launcher
    if not launcher and os.environ.get("STRATA_BUILD_DIR"):
        launcher = os.path.join(os.environ["STRATA_BUILD_DIR"], "launcher", "launcher")
    if not launcher:
        fail("check_deploy", "name the built launcher: --launcher PATH or STRATA_BUILD_DIR")
    elif not os.access(launcher, os.X_OK):
        fail("check_deploy", f"{launcher} is not an executable: build the launcher first")
    else:
        launcher = os.path.abspath(launcher)

    print("systemd units (deploy/systemd):")
    node = parse_unit(SYSTEMD / "strata-node.service")
    gateway = parse_unit(SYSTEMD / "strata-gateway.service")
    node_env = check_node_unit(node)
    gateway_env = check_gateway_unit(gateway)
    dropin = parse_unit(SYSTEMD / "etcd.service.d" / "strata.conf")
    if values(dropin, "Service", "EnvironmentFile") != ["/etc/strata/etcd.env"]:
        fail("etcd.service.d/strata.conf", "EnvironmentFile is not /etc/strata/etcd.env")
    check_etcd_env(SYSTEMD / "etcd.env.example", node_env, gateway_env)
    if launcher and os.access(launcher, os.X_OK):
        verify_units(launcher)

    print("Kubernetes manifests (deploy/kubernetes):")
    m = check_kubernetes()
    for file, doc in m.objects:
        print(f"  {file}: {doc.get('kind')}/{doc.get('metadata', {}).get('name')}")

    if problems:
        print(f"\n{len(problems)} problem(s):")
        for p in problems:
            print(f"  FAIL {p}")
        return 1
    print("\ndeploy: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
