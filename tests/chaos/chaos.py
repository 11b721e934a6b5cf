"""The fault suite's driver (tests/chaos/chaos.sh starts the graph): faults under load, each
checked for lost or hung requests, lost acknowledged adapter loads and the time until the
service answers again. Prints the figures as its last lines; exits 1 on any violation.

Usage: chaos.py URL RUN_DIR (the graph's run directory: graph.json, state/, logs/)."""
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

URL, RUN = sys.argv[1], sys.argv[2]
DEMO_ADAPTERS = os.environ["DEMO_ADAPTERS"]
CLIENT_TIMEOUT = 30.0  # a request not answered by then is hung
RECOVERY_LIMIT = 10.0  # the service answers again within this of an actor's death

violations = []


def violate(what):
    print(f"VIOLATION: {what}", flush=True)
    violations.append(what)


def http(method, path, body=None, timeout=CLIENT_TIMEOUT):
    """(status, parsed body or text); status 0 for a connection error, -1 for a timeout."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(URL + path, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(errors="replace"), e.code
    except TimeoutError:
        return -1, None
    except (urllib.error.URLError, ConnectionError, OSError) as e:
        if "timed out" in str(e):
            return -1, None
        return 0, str(e)
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def graph():
    with open(os.path.join(RUN, "graph.json")) as f:
        return {a["name"]: a for a in json.load(f)["actors"]}


# ---------------------------------------------------------------------------------------------
# load: clients sending small completions all along; every answer is counted

acknowledged = []  # adapters whose load was answered 200
models = ["demo", "reverse", "upper", "sort", "digits"]
stats = {"sent": 0, "ok": 0, "answered_error": 0, "conn_error": 0, "hung": 0}
stats_lock = threading.Lock()
stop_load = threading.Event()


def client(seed):
    rnd = random.Random(seed)
    while not stop_load.is_set():
        model = rnd.choice(models + acknowledged)
        status, _ = http("POST", "/v1/completions", {"model": model, "prompt": "input: 3 leaf road\noutput:",
                                                     "max_tokens": 6, "temperature": 0})
        with stats_lock:
            stats["sent"] += 1
            if status == 200:
                stats["ok"] += 1
            elif status == -1:
                stats["hung"] += 1
                violate(f"a request for {model} was not answered within {CLIENT_TIMEOUT:.0f} s")
            elif status == 0:
                stats["conn_error"] += 1  # the gateway itself died: the connection is closed at once
            elif status == 404:
                stats["answered_error"] += 1
                violate(f"a request for {model}, which exists, was answered 404")
            else:
                stats["answered_error"] += 1
        if status != 200:
            time.sleep(0.05)


def probe_until_ok(t0, what):
    """Seconds from t0 until a fresh request is answered 200 (at most the limit plus a margin)."""
    while time.monotonic() - t0 < RECOVERY_LIMIT + 20:
        status, _ = http("POST", "/v1/completions", {"model": "reverse", "prompt": "input: 1 2\noutput:",
                                                     "max_tokens": 2}, timeout=5)
        if status == 200:
            return time.monotonic() - t0
        time.sleep(0.05)
    violate(f"{what}: the service did not answer again within {RECOVERY_LIMIT + 20:.0f} s")
    return float("inf")


def load_adapter(name):
    status, body = http("POST", "/v1/load_lora_adapter",
                        {"lora_name": name, "lora_path": os.path.join(DEMO_ADAPTERS, "reverse")})
    if status == 200:
        acknowledged.append(name)
    return status, body


def check_acknowledged(when):
    status, body = http("GET", "/v1/models")
    if status != 200:
        violate(f"{when}: /v1/models answered {status}")
        return
    listed = {m["id"] for m in body["data"]}
    for name in acknowledged:
        if name not in listed:
            violate(f"{when}: the acknowledged adapter {name} is gone")


def wait_restarted(name, before, timeout=30):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if graph()[name]["restarts"] > before:
                return True
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    return False


tried = survived = injected = 0  # injected: deaths the suite caused (each one restart)
recoveries = []


def fault(label, act, victim=None):
    """One fault: act() does it; if an actor is the victim, its restart is awaited. Then the
    service must answer again in time and every acknowledged adapter must still be there."""
    global tried, survived, injected
    tried += 1
    injected += victim is not None
    before = graph()[victim]["restarts"] if victim else 0
    t0 = time.monotonic()
    act()
    if victim and not wait_restarted(victim, before):
        violate(f"{label}: {victim} was not restarted")
    back = probe_until_ok(t0, label)
    recoveries.append((label, back))
    ok_before = len(violations)
    if victim and back > RECOVERY_LIMIT:
        violate(f"{label}: the service answered again after {back:.1f} s (limit {RECOVERY_LIMIT:.0f} s)")
    check_acknowledged(label)
    name = f"ack{tried}"
    status, body = load_adapter(name)
    if status != 200:
        violate(f"{label}: a load after recovery was answered {status}: {body}")
    survived += len(violations) == ok_before
    print(f"{label}: service back after {back:.2f} s", flush=True)


def signal_actor(name, sig):
    return lambda: os.kill(graph()[name]["pid"], sig)


def main():
    status, body = http("GET", "/health")
    if status != 200:
        violate(f"/health answered {status} on a ready graph: {body}")
    if load_adapter("ack0")[0] != 200:
        violate("the first adapter load failed")
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    time.sleep(1)

    for name in ["worker-0", "scheduler", "detokenizer", "tokenizer", "registry", "gateway"]:
        fault(f"SIGKILL {name}", signal_actor(name, signal.SIGKILL), name)
        fault(f"SIGSTOP {name}", signal_actor(name, signal.SIGSTOP), name)

    # A torn or corrupt journal tail, then a registry restart: every acknowledged adapter is
    # restored from the records before it.
    journal = os.path.join(RUN, "state", "registry.journal")

    def corrupt():
        with open(journal, "ab") as f:
            f.write(b"\x00\x00\x01\x00this is not a journal record" + os.urandom(64))
        os.kill(graph()["registry"]["pid"], signal.SIGKILL)

    fault("corrupt journal + registry restart", corrupt, "registry")

    # The run directory's disk is full for the registry (a file size limit on its process:
    # prlimit RLIMIT_FSIZE, as an unprivileged user cannot mount a small tmpfs): a load is
    # refused with a reason (it could not be journaled), never acknowledged and then lost.
    def disk_full():
        reg_pid = graph()["registry"]["pid"]
        # the soft limit only; the restarted registry starts without it
        subprocess.run(["prlimit", f"--pid={reg_pid}", f"--fsize={os.path.getsize(journal)}:"], check=True)
        status, body = http("POST", "/v1/load_lora_adapter",
                            {"lora_name": "diskfull", "lora_path": os.path.join(DEMO_ADAPTERS, "upper")})
        print(f"disk full: a load was answered {status}: {json.dumps(body)[:160]}", flush=True)
        if status == 200:
            acknowledged.append("diskfull")
        elif not (isinstance(body, dict) and "journal" in json.dumps(body)):
            violate(f"disk full: a load was answered {status} without the journal as the reason: {body}")
        os.kill(reg_pid, signal.SIGKILL)

    fault("disk full + registry restart", disk_full, "registry")

    # The DoS request: 1,024 prompts x n=64 from one client, who gives up after 3 s. The
    # service survives it (no actor dies) and answers other requests meanwhile.
    global tried, survived
    restarts = {n: a["restarts"] for n, a in graph().items()}
    tried += 1
    ok_before = len(violations)
    dos = threading.Thread(target=http, args=("POST", "/v1/completions",
                                              {"model": "demo", "prompt": ["input: 1 2 3\noutput:"] * 1024,
                                               "n": 64, "max_tokens": 16}, 3), daemon=True)
    dos.start()
    time.sleep(0.5)
    back = probe_until_ok(time.monotonic(), "DoS request")
    if back > RECOVERY_LIMIT:
        violate(f"DoS request: another request took {back:.1f} s")
    dos.join(5)
    after = {n: a["restarts"] for n, a in graph().items()}
    if after != restarts:
        violate(f"DoS request: actors restarted: {restarts} -> {after}")
    survived += len(violations) == ok_before
    print(f"DoS request: another request answered after {back:.2f} s", flush=True)

    stop_load.set()
    deadline = time.monotonic() + CLIENT_TIMEOUT + 5  # each client ends its last request by then
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    check_acknowledged("the end")
    failed = 0
    for name in acknowledged:
        if failed == 3:  # a service that is gone fails them all: three say it, in bounded time
            break
        status, _ = http("POST", "/v1/completions", {"model": name, "prompt": "input: 1 2\noutput:", "max_tokens": 2},
                         timeout=10)
        if status != 200:
            failed += 1
            violate(f"the acknowledged adapter {name} answered {status}")

    # Every restart is one the suite caused: no actor died of what it was sent.
    crashes = sum(a["restarts"] for a in graph().values()) - injected
    if crashes:
        violate(f"{crashes} actor restarts the suite did not cause: an actor died of its input")
    worst = max(b for _, b in recoveries)
    print(f"load: {stats['sent']} requests, {stats['ok']} ok, {stats['answered_error']} answered with an error, "
          f"{stats['conn_error']} cut by the gateway's death, {stats['hung']} hung")
    print(f"adapter loads acknowledged: {len(acknowledged)}, lost: {sum(1 for v in violations if v.endswith(' is gone'))}")
    print(f"recovery: worst {worst:.2f} s, mean {sum(b for _, b in recoveries) / len(recoveries):.2f} s "
          f"over {len(recoveries)} faults")
    print(f"faults tried: {tried}, survived: {survived}, lost requests: {stats['hung']}, "
          f"crashes from input: {crashes}, violations: {len(violations)}")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
