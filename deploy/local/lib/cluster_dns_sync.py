#!/usr/bin/env python3
"""Keeps the local cluster DNS's hosts file equal to the Services' ClusterIPs (deploy/local/lib/services.sh).

Watches Services in every namespace (`kubectl get services -A --watch --output-watch-events -o json`) and writes one
line per Service with a ClusterIP, `IP NAME.NAMESPACE.svc.cluster.local`, to --out (replaced atomically; dnsmasq's
--hostsdir rereads it on its own). Headless Services (clusterIP None) and pod records are not served: nothing in
Railyard resolves them. Exits when the API server's pid file names no live process (the cluster is gone), so it
never outlives its cluster; a watch that ends (server timeout, API server restart) is re-established.
"""
import argparse
import json
import os
import subprocess
import sys
import time


def api_server_alive(pid_file):
    try:
        pid = int(open(pid_file).read().strip())
        os.kill(pid, 0)
        return True
    except (OSError, ValueError):
        return False


def write_hosts(path, services):
    lines = sorted(f"{ip} {name}.{ns}.svc.cluster.local" for (ns, name), ip in services.items())
    text = "".join(line + "\n" for line in lines)
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def cluster_ip(obj):
    ip = obj.get("spec", {}).get("clusterIP", "")
    return ip if ip and ip != "None" else None


def watch_once(args, services):
    """One watch: the initial list (ADDED events), then changes, until kubectl exits."""
    cmd = [args.kubectl, "--kubeconfig", args.kubeconfig, "get", "services", "-A", "--watch", "--output-watch-events",
           "-o", "json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    # Starts from what is served, so a re-established watch does not blank the file while its initial list arrives;
    # a Service deleted while no watch ran keeps its line until the name is reused (its IP answers nothing).
    seen = dict(services)
    decoder, buf = json.JSONDecoder(), ""
    try:
        for chunk in iter(lambda: proc.stdout.readline(), ""):
            buf += chunk
            while True:
                buf = buf.lstrip()
                if not buf:
                    break
                try:
                    event, end = decoder.raw_decode(buf)
                except ValueError:
                    break  # an object split across lines: read more
                buf = buf[end:]
                obj = event.get("object", {})
                md = obj.get("metadata", {})
                key = (md.get("namespace", ""), md.get("name", ""))
                ip = cluster_ip(obj)
                if event.get("type") == "DELETED" or ip is None:
                    seen.pop(key, None)
                else:
                    seen[key] = ip
                if seen != services:
                    services.clear()
                    services.update(seen)
                    write_hosts(args.out, services)
    finally:
        proc.kill()
        proc.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--kubectl", required=True)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--apiserver-pid-file", required=True)
    args = p.parse_args()
    services = {}
    while api_server_alive(args.apiserver_pid_file):
        watch_once(args, services)
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
