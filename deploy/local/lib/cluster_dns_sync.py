#!/usr/bin/env python3
"""Keeps the local cluster DNS's hosts file equal to what CoreDNS would answer (deploy/local/lib/services.sh).

Watches Services and Endpoints in every namespace (`kubectl get services|endpoints -A --watch --output-watch-events
-o json`, one thread each) and writes --out (replaced atomically; dnsmasq's --hostsdir rereads it on its own) with
the A (and AAAA) records of the cluster domain, as Kubernetes' DNS specification gives them:
  - a Service with a ClusterIP: `IP NAME.NAMESPACE.svc.cluster.local`;
  - a headless Service (clusterIP None): `NAME.NAMESPACE.svc.cluster.local` answers every address of its Endpoints,
    and each address with a hostname (a pod with `hostname` and `subdomain: NAME`) gets
    `HOSTNAME.NAME.NAMESPACE.svc.cluster.local`; a Service with publishNotReadyAddresses lists not-ready pods among
    the addresses (the endpoints controller does that), so their names resolve before any readiness.
Not served: SRV records, `POD-IP.NAMESPACE.pod` names, ExternalName Services. Every name and address is checked (a DNS
label, an IPv4 or IPv6 address) before it goes into the file: the API server validates them already, and a line
this script writes must never carry anything else. Exits when the API server's pid file names no live process (the
cluster is gone), so it never outlives its cluster; a watch that ends (server timeout, API server restart) is
re-established.
"""
import argparse
import ipaddress
import json
import os
import re
import subprocess
import sys
import threading
import time

DOMAIN = "cluster.local"
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def dns_label(s):
    return isinstance(s, str) and _LABEL.match(s) is not None


def ip_address(s):
    try:
        return str(ipaddress.ip_address(s)) if isinstance(s, str) else None
    except ValueError:
        return None


def service_entry(obj):
    """A Service object -> ("cluster", IP), ("headless", None), or None (nothing to serve: ExternalName, no IP yet)."""
    spec = obj.get("spec") or {}
    ip = spec.get("clusterIP", "")
    if ip == "None":
        return ("headless", None)
    ip = ip_address(ip)
    return ("cluster", ip) if ip else None


def endpoint_addresses(obj):
    """An Endpoints object -> [(ip, hostname or None)], its ready addresses in order, each checked, without repeats."""
    out = []
    for subset in obj.get("subsets") or []:
        for a in (subset or {}).get("addresses") or []:
            ip = ip_address((a or {}).get("ip"))
            if not ip:
                continue
            host = a.get("hostname")
            entry = (ip, host if dns_label(host) else None)
            if entry not in out:
                out.append(entry)
    return out


def records(services, endpoints):
    """The hosts file's lines: services {(ns, name): entry}, endpoints {(ns, name): [(ip, hostname)]}."""
    lines = set()
    for (ns, name), entry in services.items():
        if not (dns_label(ns) and dns_label(name)) or entry is None:
            continue
        fqdn = f"{name}.{ns}.svc.{DOMAIN}"
        kind, ip = entry
        if kind == "cluster":
            lines.add(f"{ip} {fqdn}")
            continue
        for ip, host in endpoints.get((ns, name), []):
            lines.add(f"{ip} {fqdn}")
            if host:
                lines.add(f"{ip} {host}.{fqdn}")
    return sorted(lines)


def write_hosts(path, lines):
    text = "".join(line + "\n" for line in lines)
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class State:
    """What both watches have seen; the file is rewritten whenever the records it yields change."""

    def __init__(self, out):
        self.out = out
        self.lock = threading.Lock()
        self.maps = {"services": {}, "endpoints": {}}
        self.written = None

    def update(self, kind, key, value):
        with self.lock:
            m = self.maps[kind]
            if value is None:
                m.pop(key, None)
            else:
                m[key] = value
            lines = records(self.maps["services"], self.maps["endpoints"])
            if lines != self.written:
                write_hosts(self.out, lines)
                self.written = lines


def watch_once(args, kind, state):
    """One watch of `kind`: the initial list (ADDED events), then changes, until kubectl exits."""
    cmd = [args.kubectl, "--kubeconfig", args.kubeconfig, "get", kind, "-A", "--watch", "--output-watch-events",
           "-o", "json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # Starts from what is served, so a re-established watch does not blank the file while its initial list arrives;
    # an object deleted while no watch ran keeps its lines until the name is reused (its IP answers nothing).
    decoder, buf = json.JSONDecoder(), ""
    try:
        for chunk in iter(lambda: proc.stdout.readline(), ""):
            buf += chunk
            if len(buf) > (64 << 20):  # one object larger than any Service or Endpoints: drop it, read on
                buf = ""
                continue
            while True:
                buf = buf.lstrip()
                if not buf:
                    break
                try:
                    event, end = decoder.raw_decode(buf)
                except ValueError:
                    break  # an object split across lines: read more
                buf = buf[end:]
                if not isinstance(event, dict):
                    continue
                obj = event.get("object") or {}
                md = obj.get("metadata") or {}
                key = (md.get("namespace", ""), md.get("name", ""))
                if event.get("type") == "DELETED":
                    value = None
                elif kind == "services":
                    value = service_entry(obj)
                else:
                    value = endpoint_addresses(obj)
                state.update(kind, key, value)
    finally:
        proc.kill()
        proc.wait()


def api_server_alive(pid_file):
    try:
        pid = int(open(pid_file).read().strip())
        os.kill(pid, 0)
        return True
    except (OSError, ValueError):
        return False


def keep_watching(args, kind, state):
    while api_server_alive(args.apiserver_pid_file):
        watch_once(args, kind, state)
        time.sleep(0.5)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kubectl", required=True)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--apiserver-pid-file", required=True)
    args = p.parse_args()
    state = State(args.out)
    threads = [threading.Thread(target=keep_watching, args=(args, kind, state), daemon=True)
               for kind in ("services", "endpoints")]
    for t in threads:
        t.start()
    # Either watch ends only when the API server is gone; then so does this process.
    for t in threads:
        t.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
