"""The exporter's HTTP API with a real HTTP client (urllib) against `skewscope export --from`
on generator captures (no root). Ground truth: the generator's truth (hot destination and its
dispatch share, the slow shard and its lag, the overloaded instance), and `diagnose --json`
run on the same file (the findings must be the same objects)."""
from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from skewscope import gen as skewgen
from skewscope.cli.common import load_source
from skewscope.outputs import metrics as M

SERVING = re.compile(r"serving http://(\S+?)/metrics")
TOKEN = "s3cr3t-t0ken"


def start_export(*args, log):
    """skewscope export ... --listen 127.0.0.1:0; returns (process, base URL, stderr file)."""
    err = open(log, "w+")
    p = subprocess.Popen([sys.executable, "-m", "skewscope.cli", "export", *args], stdout=subprocess.DEVNULL,
                         stderr=err, text=True)
    deadline = time.monotonic() + 400   # a loaded machine, or numba compiling after a source change
    while time.monotonic() < deadline:
        err.seek(0)
        m = SERVING.search(err.read())
        if m:
            return p, f"http://{m.group(1)}", err
        if p.poll() is not None:
            err.seek(0)
            raise AssertionError(f"export exited {p.returncode}: {err.read()}")
        time.sleep(0.2)
    p.kill()
    raise AssertionError("export did not start")


def get(url, token=None, method="GET", data=None):
    req = urllib.request.Request(url, method=method, data=data)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def get_json(url, token=None, timeout=300):
    """The JSON document once the analysis is done (503 until then)."""
    deadline = time.monotonic() + timeout
    while True:
        code, hdr, body = get(url, token)
        if code != 503 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert code == 200, (code, body[:300])
    assert hdr["Content-Type"].startswith("application/json")
    return json.loads(body)


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    d = tmp_path_factory.mktemp("ssE-http")
    tok = d / "token"
    tok.write_text(TOKEN + "\n")
    files, truths = {}, {}
    for name in ("ep-decode-hot-expert", "tp-decode-slow-shard", "tp-decode-instances"):
        p = d / f"{name}.pcap"
        truths[name] = skewgen.write(name, str(p), seed=3).truth
        files[name] = p
    # the offline parser compiled and cached here first (numba recompiles after a source
    # change), so the exporters' start is only their own
    load_source(str(files["tp-decode-slow-shard"]))
    procs = {}
    try:
        # the hot expert behind a token with /metrics open; the instances behind a token on
        # everything; the slow shard without a token
        procs["ep-decode-hot-expert"] = start_export("--from", str(files["ep-decode-hot-expert"]), "--listen",
                                                     "127.0.0.1:0", "--token-file", str(tok), "--open-metrics",
                                                     log=d / "ep.err")
        procs["tp-decode-slow-shard"] = start_export("--from", str(files["tp-decode-slow-shard"]), "--listen",
                                                     ":0", log=d / "tp.err")
        procs["tp-decode-instances"] = start_export("--from", str(files["tp-decode-instances"]), "--listen",
                                                    "127.0.0.1:0", "--token-file", str(tok), log=d / "inst.err")
        yield {k: (v[1], files[k], truths[k], v[2]) for k, v in procs.items()}
    finally:
        for v in procs.values():
            stop(v[0])


def diagnose_json(path):
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "diagnose", str(path), "--json"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode in (0, 1, 2), r.stderr
    return json.loads(r.stdout)


def comparable(f):
    return {k: f[k] for k in ("kind", "severity", "entities", "message", "evidence", "impact")}


@pytest.mark.parametrize("name,token", [("ep-decode-hot-expert", TOKEN), ("tp-decode-slow-shard", None),
                                        ("tp-decode-instances", TOKEN)])
def test_findings_are_diagnose_findings(servers, name, token):
    url, path, truth, _ = servers[name]
    doc = get_json(url + "/v1/findings", token)
    assert doc["version"] == 1 and doc["source"] == "file"
    want = diagnose_json(path)
    assert [comparable(f) for f in doc["findings"]] == [comparable(f) for f in want["findings"]]
    for f in doc["findings"]:        # the event schema's finding objects (outputs.events)
        assert f["id"].startswith(f["kind"] + ":") and isinstance(f["actions"], list)
    assert doc["status"] == want["status"] and doc["counts"] == want["counts"]
    # the incidents and each finding's incident id, as diagnose gives them (analysis.incidents)
    assert doc["incidents"] == want["incidents"] and doc["incidents"]
    assert [f["incident"] for f in doc["findings"]] == [f["incident"] for f in want["findings"]]
    assert doc["window"]["duration_s"] == pytest.approx(want["capture"]["duration_s"])
    assert doc["analyses"]["runs"] == 1
    # and the generator's expected kinds are among them
    kinds = {f["kind"] for f in doc["findings"]}
    assert set(truth["inference"]["expected_kinds"]) <= kinds


def test_load_hot_destination_share_matches_truth(servers):
    url, _, truth, _ = servers["ep-decode-hot-expert"]
    mag = [p for p in truth["pathologies"] if p["kind"] == "hot_destination"][0]["magnitude"]
    doc = get_json(url + "/v1/load", TOKEN)
    assert doc["version"] == 1
    (g,) = [g for g in doc["alltoall"] if set(g["members"]) == set(mag["members"])]
    assert g["hot_destination"] == mag["hot"]
    d = {x["ip"]: x for x in g["destinations"]}
    top = max(d.values(), key=lambda x: x["share"])
    assert top["ip"] == mag["hot"]
    assert top["share"] == pytest.approx(mag["dispatch_dest_share"], rel=0.02)
    assert sum(x["share"] for x in d.values()) == pytest.approx(1.0)
    # bytes/s: the whole capture's bytes into each destination over the capture
    assert all(x["bytes_per_s"] > 0 for x in d.values())
    assert top["bytes_per_s"] == max(x["bytes_per_s"] for x in d.values())


def test_load_slow_member_lag_matches_truth(servers):
    url, _, truth, _ = servers["tp-decode-slow-shard"]
    mag = [p for p in truth["pathologies"] if p["kind"] == "slow_tp_shard"][0]
    slow_ip = mag["entities"]["ips"][0]
    doc = get_json(url + "/v1/load")
    (r,) = [r for r in doc["rings"] if set(r["members"]) == set(mag["magnitude"]["members"])]
    assert r["slowest"]["ip"] == slow_ip
    assert r["slowest"]["lag_s"] * 1e6 == pytest.approx(mag["magnitude"]["lag_per_step_us"], rel=0.2)
    assert all(abs(v) < 0.25 * r["slowest"]["lag_s"] for ip, v in r["lag_s"].items() if ip != slow_ip)
    assert r["gate_share"].get(slow_ip, 0) >= 0.9
    (inst,) = [x for x in doc["instances"] if x["group"] == r["group"]]
    assert inst["tokens"] == mag["magnitude"]["tokens"]
    assert inst["tokens_per_s"] == pytest.approx(1 / mag["magnitude"]["token_period_s"], rel=0.05)


def _truth_loads(truth):
    """Per decode_tp group: data bytes per second from the generator's plan (allreduce bytes x
    all-reduces per token / token period), and its members."""
    out = []
    for g in truth["groups"]:
        det = g.get("details") or {}
        if det.get("variant") != "decode_tp":
            continue
        out.append((g["members"], det["allreduce_bytes"] * det["allreduces_per_token"] / det["token_period_s"],
                    det["token_period_s"]))
    return out


def test_load_instances_and_overloaded_instance_finding(servers):
    url, _, truth, _ = servers["tp-decode-instances"]
    tl = _truth_loads(truth)
    assert len(tl) == 4
    doc = get_json(url + "/v1/load", TOKEN)
    got = {tuple(sorted(x["members"])): x for x in doc["instances"]}
    assert set(got) == {tuple(sorted(m)) for m, _, _ in tl}
    base = min(v for _, v, _ in tl)
    gbase = min(x["bytes_per_s"] for x in got.values())
    for mem, v, period in tl:
        x = got[tuple(sorted(mem))]
        assert x["bytes_per_s"] / gbase == pytest.approx(v / base, rel=0.05)      # the load ratios
        assert x["tokens_per_s"] == pytest.approx(1 / period, rel=0.05)
        assert x["busy_share"] is not None and 0 < x["busy_share"] < 1
    hot = max(tl, key=lambda t: t[1])[0]
    sizes = {tuple(sorted(m)): x["message_size_bytes"] for m, x in got.items()}
    assert sizes[tuple(sorted(hot))] == 4 * min(sizes.values())                # batch 4 vs 1
    f = get_json(url + "/v1/findings", TOKEN)["findings"]
    inst = [x for x in f if x["kind"] == "instance_load_imbalance"]
    assert [sorted(x["entities"]["ips"]) for x in inst] == [sorted(hot)]
    (act,) = inst[0]["actions"]
    others = [m for m, _, _ in tl if m != hot]
    assert act["type"] == "reroute_requests" and sorted(act["to"]) == sorted(m[0] for m in others)


def test_token_enforced(servers):
    url, _, _, _ = servers["tp-decode-instances"]
    for path in ("/metrics", "/v1/findings", "/v1/load"):
        code, hdr, _ = get(url + path)
        assert code == 401 and hdr.get("WWW-Authenticate", "").startswith("Bearer")
        assert get(url + path, token="wrong")[0] == 401
        assert get(url + path, token=TOKEN)[0] in (200, 503)
    # --open-metrics: /metrics without, the JSON still needs it
    url, _, _, _ = servers["ep-decode-hot-expert"]
    code, hdr, body = get(url + "/metrics")
    assert code == 200 and hdr["Content-Type"].startswith("text/plain")
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert M.FRAMES.name.removesuffix("_total") in names and M.PEERS.name in names
    assert get(url + "/v1/load")[0] == 401
    assert get(url + "/v1/load", token=TOKEN)[0] in (200, 503)


def test_read_only_and_unknown_paths(servers):
    url, _, _, _ = servers["tp-decode-slow-shard"]
    for m in ("POST", "PUT", "DELETE", "PATCH"):
        code, hdr, body = get(url + "/v1/findings", method=m, data=b"{}")
        assert code == 405 and "GET" in hdr["Allow"], (m, code)
        assert json.loads(body)["error"]
    code, _, body = get(url + "/v2/nothing")
    assert code == 404 and json.loads(body)["version"] == 1
    code, hdr, body = get(url + "/v1/load", method="HEAD")
    assert code in (200, 503) and body == b""


def test_metrics_same_bytes_as_once(servers):
    url, path, _, _ = servers["tp-decode-slow-shard"]
    code, _, body = get(url + "/metrics")
    assert code == 200
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "export", "--from", str(path), "--once"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr

    def stable(text):   # the same families and samples, minus the process_* and read-time ones
        skip = ("process_", "skewscope_last_read", "skewscope_read_duration")
        return sorted(ln for ln in text.splitlines() if not ln.startswith(skip) and not ln.startswith("# ")
                      and not any(ln.startswith("#") and s in ln for s in skip))
    assert stable(body.decode()) == stable(r.stdout)


def test_loopback_default_and_warning(servers, tmp_path):
    url, _, _, _ = servers["tp-decode-slow-shard"]       # started with --listen :0
    assert url.startswith("http://127.0.0.1:")
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "export", "--help"], capture_output=True, text=True,
                       timeout=60)
    assert re.search(r"--listen.*\[default:\s*127\.0\.0\.1:9435\]", r.stdout, re.S)
    # not reachable on this host's other addresses
    port = int(url.rsplit(":", 1)[1])
    others = [a for a in _local_addresses() if not a.startswith("127.")]
    for a in others:
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex((a, port)) != 0, a
    # a non-loopback listen without a token: one warning line, still serving
    p, url2, err = start_export("--from", str(servers["tp-decode-slow-shard"][1]), "--listen", "0.0.0.0:0",
                                "--no-analysis", log=tmp_path / "any.err")
    try:
        err.seek(0)
        lines = [ln for ln in err.read().splitlines() if "warning" in ln]
        assert len(lines) == 1 and "--token-file" in lines[0]
        assert get(url2.replace("0.0.0.0", "127.0.0.1") + "/metrics")[0] == 200
        assert get(url2.replace("0.0.0.0", "127.0.0.1") + "/v1/findings")[0] == 503
    finally:
        stop(p)


def _local_addresses():
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True).stdout
    return re.findall(r"inet (\d+\.\d+\.\d+\.\d+)/", out)


@pytest.mark.parametrize("content,msg", [("", "empty"), ("two words\n", "spaces")])
def test_bad_token_file_is_one_line(tmp_path, content, msg):
    f = tmp_path / "tok"
    f.write_text(content)
    snap = tmp_path / "missing.pcap"
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "export", "--from", str(snap), "--token-file", str(f)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = subprocess.run([sys.executable, "-m", "skewscope.cli", "export", "--from", str(snap), "--token-file",
                        str(tmp_path / "nope")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "nope" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr



def test_idle_and_broken_clients_do_not_block_or_print_tracebacks(servers):
    url, _, _, err = servers["tp-decode-slow-shard"]
    host, port = url[len("http://"):].rsplit(":", 1)
    idle = socket.create_connection((host, int(port)), timeout=5)          # says nothing
    half = socket.create_connection((host, int(port)), timeout=5)
    half.sendall(b"GET /metr")                                              # and goes away
    half.close()
    rst = socket.create_connection((host, int(port)), timeout=5)
    rst.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    rst.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    rst.close()                                                              # reset mid-answer
    try:
        for _ in range(3):
            assert get(url + "/metrics")[0] == 200
    finally:
        idle.close()
    time.sleep(0.5)
    err.seek(0)
    assert "Traceback" not in err.read()
