#!/usr/bin/env python3
"""The deployment files in deploy/ (ctest deploy_manifests).

Every YAML file there parses (python3-yaml) into Kubernetes objects; every --flag that a
manifest or the Dockerfile passes to loraserve is one the launcher knows, as its own --help
lists them; and the pieces agree: the probes use the gateway's readiness and liveness endpoints
on the port the gateway is given, the gateway listens beyond loopback, the adapter directories
are mounted, and the Service and InferencePool select the Deployment's pods on that port.

usage: check_deploy.py DEPLOY_DIR LAUNCH_SCRIPT BIN_DIR
"""
import json
import os
import re
import subprocess
import sys

import yaml

READINESS, LIVENESS = "/health", "/health/live"  # docs/api.md
POOL_API = "inference.networking.x-k8s.io/"

failures = []


def fail(where, why):
    failures.append(f"{where}: {why}")


def launcher_flags(launch_script, bin_dir):
    """The flags the launcher takes, from its --help (lines '  --name ARG   help')."""
    env = dict(os.environ, LORASERVE_BIN=bin_dir)
    out = subprocess.run([launch_script, "--help"], env=env, capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    flags = set(re.findall(r"^\s+(--[a-z0-9][a-z0-9-]*)", text, re.M))
    if "--port" not in flags or "--lora-dirs" not in flags:
        sys.exit(f"could not read the launcher's flags from its --help:\n{text}")
    return flags | {"--help"}


def flags_of(args):
    """The --flags among a command line's words (--name=value counts as --name)."""
    return [a.split("=", 1)[0] for a in args if isinstance(a, str) and a.startswith("--")]


def value_of(args, flag):
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return str(args[i + 1])
        if isinstance(a, str) and a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def is_loraserve(container):
    words = [container.get("image", "")] + [str(w) for w in container.get("command", [])]
    return any("loraserve" in w for w in words)


def port_number(container, ref):
    """A probe's or Service's port (a number, or a container port's name) as a number."""
    if isinstance(ref, int):
        return ref
    for p in container.get("ports", []):
        if p.get("name") == ref:
            return p.get("containerPort")
    return None


def check_deployment(where, obj, known):
    """The loraserve containers of a Deployment; returns (pod labels, gateway port) of the last."""
    pod = obj.get("spec", {}).get("template", {})
    labels = pod.get("metadata", {}).get("labels", {})
    selector = obj.get("spec", {}).get("selector", {}).get("matchLabels", {})
    if not selector or any(labels.get(k) != v for k, v in selector.items()):
        fail(where, f"selector {selector} does not match the pod labels {labels}")
    found = None
    for c in pod.get("spec", {}).get("containers", []):
        if not is_loraserve(c):
            continue
        w = f"{where} container {c.get('name')}"
        args = [str(a) for a in c.get("command", [])[1:] + c.get("args", [])]
        for f in flags_of(args):
            if f not in known:
                fail(w, f"{f} is not a flag of the launcher (launch/loraserve --help)")
        port = value_of(args, "--port")
        if port is None or not port.isdigit():
            fail(w, "no --port: the gateway would listen on its default, which the manifest must name")
            continue
        port = int(port)
        if port not in [p.get("containerPort") for p in c.get("ports", [])]:
            fail(w, f"--port {port} is not among the container's ports")
        if value_of(args, "--host") not in ("0.0.0.0", "::"):
            fail(w, "no --host 0.0.0.0: the gateway listens on loopback only by default, out of the probes' reach")
        for probe, path in (("readinessProbe", READINESS), ("livenessProbe", LIVENESS)):
            get = c.get(probe, {}).get("httpGet")
            if not get:
                fail(w, f"no {probe} with httpGet")
                continue
            if get.get("path") != path:
                fail(w, f"{probe} on {get.get('path')}, not the gateway's {path}")
            if port_number(c, get.get("port")) != port:
                fail(w, f"{probe} on port {get.get('port')}, not the gateway's {port}")
        mounts = [m.get("mountPath") for m in c.get("volumeMounts", [])]
        for d in (value_of(args, "--lora-dirs"), value_of(args, "--model-path"), value_of(args, "--run-dir")):
            if d and not d.startswith("/opt/loraserve/") and not any(d == m or d.startswith(m.rstrip("/") + "/") for m in mounts):
                fail(w, f"{d} is on no volume mount ({mounts})")
        found = (labels, port, c)
    return found


def check_dockerfile(path, known):
    """The flags of the Dockerfile's exec-form ENTRYPOINT and CMD."""
    for n, line in enumerate(open(path), 1):
        m = re.match(r"\s*(ENTRYPOINT|CMD)\s+(\[.*\])\s*$", line)
        if not m:
            continue
        for f in flags_of(json.loads(m.group(2))):
            if f not in known:
                fail(f"{path}:{n}", f"{f} is not a flag of the launcher (launch/loraserve --help)")


def main():
    deploy_dir, launch_script, bin_dir = sys.argv[1:4]
    known = launcher_flags(launch_script, bin_dir)
    objects = []
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(deploy_dir) for f in fs if f.endswith((".yaml", ".yml")))
    if not files:
        sys.exit(f"no YAML files under {deploy_dir}")
    for path in files:
        try:
            docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
        except yaml.YAMLError as e:
            fail(path, f"does not parse: {e}")
            continue
        for i, d in enumerate(docs):
            where = f"{path} #{i + 1}"
            if not isinstance(d, dict) or not all(k in d for k in ("apiVersion", "kind", "metadata")):
                fail(where, "not a Kubernetes object (apiVersion, kind, metadata)")
                continue
            if not d["metadata"].get("name"):
                fail(where, "no metadata.name")
            objects.append((f"{where} {d['kind']}/{d['metadata'].get('name')}", d))
    check_dockerfile(os.path.join(deploy_dir, "Dockerfile"), known)

    served = None
    for where, d in objects:
        if d["kind"] == "Deployment":
            served = check_deployment(where, d, known) or served
    if not served:
        fail(deploy_dir, "no Deployment runs loraserve")
    else:
        labels, port, container = served
        pools = 0
        for where, d in objects:
            spec = d.get("spec", {})
            if d["kind"] == "Service":
                sel = spec.get("selector", {})
                if sel and all(labels.get(k) == v for k, v in sel.items()):
                    for p in spec.get("ports", []):
                        if port_number(container, p.get("targetPort", p.get("port"))) != port:
                            fail(where, f"targets port {p.get('targetPort')}, not the gateway's {port}")
            elif d["kind"] == "InferencePool":
                pools += 1
                if not d["apiVersion"].startswith(POOL_API):
                    fail(where, f"apiVersion {d['apiVersion']}, not {POOL_API}…")
                sel = spec.get("selector", {})
                if not sel or any(labels.get(k) != v for k, v in sel.items()):
                    fail(where, f"selector {sel} does not select the loraserve pods {labels}")
                if spec.get("targetPortNumber") != port:
                    fail(where, f"targetPortNumber {spec.get('targetPortNumber')}, not the gateway's {port}")
                if not spec.get("extensionRef", {}).get("name"):
                    fail(where, "no extensionRef naming the endpoint picker")
        if not pools:
            fail(deploy_dir, "no InferencePool")

    for f in failures:
        print(f"FAIL {f}")
    print(f"{len(files)} manifest files, {len(objects)} objects, {len(known)} launcher flags: "
          f"{'ok' if not failures else str(len(failures)) + ' failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
