#!/usr/bin/env python3
"""The local cluster DNS's records (deploy/local/lib/cluster_dns_sync.py), as pure logic and over a fake watch.

What a pod of the real-node cluster resolves comes from these lines (dnsmasq serves the file as it is): a Service's
ClusterIP, a headless Service's addresses and its pods' `<hostname>.<service>.<namespace>.svc.cluster.local` names
(the stable names of docs/programs.md), nothing for a name the API server would refuse and no line with anything but
an address and a DNS name.
"""
import argparse
import importlib.util
import json
import os
import stat
import sys
import tempfile
import unittest

SRC = os.environ.get("RAILYARD_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..", "..")
spec = importlib.util.spec_from_file_location("cluster_dns_sync", os.path.join(SRC, "deploy/local/lib/cluster_dns_sync.py"))
dns = importlib.util.module_from_spec(spec)
spec.loader.exec_module(dns)


def read(path):
    with open(path) as f:
        return f.read()


def endpoints(*addresses, not_ready=()):
    return {"subsets": [{"addresses": [dict(ip=ip, **({"hostname": h} if h else {})) for ip, h in addresses],
                         "notReadyAddresses": [{"ip": ip} for ip in not_ready]}]}


class Records(unittest.TestCase):
    def test_cluster_ip_service(self):
        services = {("default", "kubernetes"): dns.service_entry({"spec": {"clusterIP": "10.96.0.1"}})}
        self.assertEqual(dns.records(services, {}), ["10.96.0.1 kubernetes.default.svc.cluster.local"])

    def test_headless_service_names_its_pods(self):
        services = {("team", "job"): dns.service_entry({"spec": {"clusterIP": "None"}})}
        eps = {("team", "job"): dns.endpoint_addresses(endpoints(("10.1.0.5", "job-worker-0"), ("10.1.0.6", "job-worker-1"),
                                                                not_ready=["10.1.0.9"]))}
        self.assertEqual(dns.records(services, eps), [
            "10.1.0.5 job-worker-0.job.team.svc.cluster.local",
            "10.1.0.5 job.team.svc.cluster.local",
            "10.1.0.6 job-worker-1.job.team.svc.cluster.local",
            "10.1.0.6 job.team.svc.cluster.local",
        ])  # notReadyAddresses are not served (publishNotReadyAddresses moves them into addresses)

    def test_headless_without_hostnames_and_without_endpoints(self):
        services = {("team", "a"): ("headless", None), ("team", "b"): ("headless", None)}
        eps = {("team", "a"): dns.endpoint_addresses(endpoints(("10.1.0.7", None)))}
        self.assertEqual(dns.records(services, eps), ["10.1.0.7 a.team.svc.cluster.local"])

    def test_endpoints_of_a_cluster_ip_service_name_no_pods(self):
        services = {("team", "web"): ("cluster", "10.96.0.20")}
        eps = {("team", "web"): dns.endpoint_addresses(endpoints(("10.1.0.5", "web-0")))}
        self.assertEqual(dns.records(services, eps), ["10.96.0.20 web.team.svc.cluster.local"])

    def test_endpoints_without_a_service_serve_nothing(self):
        self.assertEqual(dns.records({}, {("team", "x"): [("10.1.0.5", "x-0")]}), [])

    def test_nothing_unchecked_reaches_the_file(self):
        self.assertIsNone(dns.service_entry({"spec": {"type": "ExternalName", "externalName": "example.com"}}))
        self.assertIsNone(dns.service_entry({"spec": {"clusterIP": "10.96.0.1 evil.example"}}))
        self.assertIsNone(dns.service_entry({}))
        got = dns.endpoint_addresses(endpoints(("10.1.0.5\n6.6.6.6 x", "h"), ("10.1.0.6", "Bad Host"), ("10.1.0.7", "a" * 64),
                                               ("fd00::5", "v6"), ("10.1.0.6", "Bad Host")))
        self.assertEqual(got, [("10.1.0.6", None), ("10.1.0.7", None), ("fd00::5", "v6")])
        self.assertEqual(dns.endpoint_addresses({"subsets": None}), [])
        self.assertEqual(dns.endpoint_addresses({"subsets": [None, {"addresses": [None, {"ip": 5}]}]}), [])
        services = {("Team", "x"): ("cluster", "10.96.0.2"), ("team", "x.y"): ("cluster", "10.96.0.3"),
                    ("team", "ok"): ("cluster", "10.96.0.4")}
        self.assertEqual(dns.records(services, {}), ["10.96.0.4 ok.team.svc.cluster.local"])
        for line in dns.records({("t", "s"): ("headless", None)}, {("t", "s"): got}):
            ip, name = line.split(" ")
            self.assertTrue(dns.ip_address(ip) and all(dns.dns_label(l) for l in name.split(".")), line)


class Watch(unittest.TestCase):
    """watch_once over a fake kubectl printing what `kubectl get -A --watch --output-watch-events -o json` prints:
    pretty-printed events, one object across many lines."""

    def run_watch(self, kind, events, state):
        with tempfile.TemporaryDirectory() as d:
            data = os.path.join(d, "events.json")
            with open(data, "w") as f:
                for e in events:
                    f.write(json.dumps(e, indent=4) + "\n")
            fake = os.path.join(d, "kubectl")
            with open(fake, "w") as f:
                f.write(f"#!/bin/sh\ncat {data}\n")
            os.chmod(fake, stat.S_IRWXU)
            dns.watch_once(argparse.Namespace(kubectl=fake, kubeconfig="/dev/null"), kind, state)

    def test_services_then_endpoints_then_deletion(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "services")
            state = dns.State(out)
            svc = {"metadata": {"namespace": "team", "name": "job"}, "spec": {"clusterIP": "None"}}
            self.run_watch("services", [{"type": "ADDED", "object": svc}, "not an event"], state)
            self.assertEqual(read(out), "")
            ep = {"metadata": {"namespace": "team", "name": "job"}, **endpoints(("10.1.0.5", "job-worker-0"))}
            self.run_watch("endpoints", [{"type": "ADDED", "object": ep}], state)
            self.assertEqual(read(out), "10.1.0.5 job-worker-0.job.team.svc.cluster.local\n"
                                               "10.1.0.5 job.team.svc.cluster.local\n")
            # The pod replaced on another node: its name follows the new address.
            ep2 = {"metadata": {"namespace": "team", "name": "job"}, **endpoints(("10.1.0.8", "job-worker-0"))}
            self.run_watch("endpoints", [{"type": "MODIFIED", "object": ep2}], state)
            self.assertIn("10.1.0.8 job-worker-0.job.team.svc.cluster.local\n", read(out))
            self.assertNotIn("10.1.0.5", read(out))
            self.run_watch("services", [{"type": "DELETED", "object": svc}], state)
            self.assertEqual(read(out), "")


if __name__ == "__main__":
    unittest.main()
