#!/usr/bin/env python3
"""Checks pods against Kubernetes' "restricted" Pod Security Standard (its baseline rules included), as the
PodSecurity admission controller of a newer API server would: the local API server (v1.20) has none.

Usage: pod_security.py FILE|-   FILE holds a Pod, a List of Pods, a workload with a pod template (Deployment, Job,
...), or a List of those (`kubectl get pods -o json`, a rendered chart as JSON). Prints one line per violation,
naming the object, the container and the field, and exits 1 if there is any; exits 0 and prints the number of pods
checked otherwise. The rules follow the standard's table (kubernetes.io/docs/concepts/security/pod-security-standards)."""
import json
import sys

ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                   "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def pod_specs(obj):
    """(name, metadata, pod spec) of every pod or pod template in obj."""
    if obj.get("kind", "").endswith("List") or ("items" in obj and "kind" not in obj):
        for item in obj.get("items", []):
            yield from pod_specs(item)
        return
    kind, meta = obj.get("kind", "?"), obj.get("metadata", {})
    name = f"{kind}/{meta.get('namespace', '') + '/' if meta.get('namespace') else ''}{meta.get('name', '?')}"
    if kind == "Pod":
        yield name, meta, obj.get("spec", {})
        return
    spec = obj.get("spec", {})
    if kind == "CronJob":
        spec = spec.get("jobTemplate", {}).get("spec", {})
    tmpl = spec.get("template")
    if isinstance(tmpl, dict) and "spec" in tmpl:
        yield name, tmpl.get("metadata", {}), tmpl["spec"]


def check(name, meta, spec):
    bad = []
    psc = spec.get("securityContext") or {}

    def v(where, msg):
        bad.append(f"{name}: {where}: {msg}")

    for f in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(f):
            v(f"spec.{f}", "must be unset or false")
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        v("spec.securityContext.windowsOptions.hostProcess", "must be unset or false")
    for s in psc.get("sysctls") or []:
        if s.get("name") not in SAFE_SYSCTLS:
            v("spec.securityContext.sysctls", f"{s.get('name')} is not a safe sysctl")
    for vol in spec.get("volumes") or []:
        types = [k for k in vol if k != "name"]
        for t in types:
            if t not in ALLOWED_VOLUMES:
                v(f"spec.volumes[{vol.get('name')}]", f"volume type {t} is not allowed (only {sorted(ALLOWED_VOLUMES)})")
    for k, val in (meta.get("annotations") or {}).items():
        if k.startswith("container.apparmor.security.beta.kubernetes.io/") and not (
                val == "runtime/default" or val.startswith("localhost/")):
            v(f"metadata.annotations[{k}]", f"AppArmor profile {val} is not allowed")

    def selinux(where, opts):
        if not opts:
            return
        if opts.get("type", "") not in SELINUX_TYPES:
            v(where + ".seLinuxOptions.type", f"{opts.get('type')} is not allowed")
        for f in ("user", "role"):
            if opts.get(f):
                v(where + f".seLinuxOptions.{f}", "must be unset")

    selinux("spec.securityContext", psc.get("seLinuxOptions"))
    pod_nonroot = psc.get("runAsNonRoot") is True
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    if pod_seccomp is not None and pod_seccomp not in ("RuntimeDefault", "Localhost"):
        v("spec.securityContext.seccompProfile.type", f"{pod_seccomp} is not allowed (RuntimeDefault or Localhost)")
    if psc.get("runAsUser") == 0:
        v("spec.securityContext.runAsUser", "must not be 0")

    for field in ("initContainers", "containers", "ephemeralContainers"):
        for c in spec.get(field) or []:
            where = f"spec.{field}[{c.get('name')}]"
            sc = c.get("securityContext") or {}
            if sc.get("privileged"):
                v(where + ".securityContext.privileged", "must be unset or false")
            if (sc.get("windowsOptions") or {}).get("hostProcess"):
                v(where + ".securityContext.windowsOptions.hostProcess", "must be unset or false")
            if sc.get("procMount", "Default") != "Default":
                v(where + ".securityContext.procMount", "must be unset or Default")
            selinux(where + ".securityContext", sc.get("seLinuxOptions"))
            for p in c.get("ports") or []:
                if p.get("hostPort"):
                    v(where + ".ports", f"hostPort {p['hostPort']} is not allowed")
            if sc.get("allowPrivilegeEscalation") is not False:
                v(where + ".securityContext.allowPrivilegeEscalation", "must be false")
            nonroot = sc.get("runAsNonRoot")
            if nonroot is False or (nonroot is None and not pod_nonroot):
                v(where + ".securityContext.runAsNonRoot", "must be true (here or in spec.securityContext)")
            if sc.get("runAsUser") == 0:
                v(where + ".securityContext.runAsUser", "must not be 0")
            seccomp = (sc.get("seccompProfile") or {}).get("type")
            if seccomp is not None and seccomp not in ("RuntimeDefault", "Localhost"):
                v(where + ".securityContext.seccompProfile.type", f"{seccomp} is not allowed")
            if seccomp is None and pod_seccomp is None:
                v(where + ".securityContext.seccompProfile",
                  "must be RuntimeDefault or Localhost (here or in spec.securityContext)")
            caps = sc.get("capabilities") or {}
            if "ALL" not in (caps.get("drop") or []):
                v(where + ".securityContext.capabilities.drop", "must include ALL")
            for cap in caps.get("add") or []:
                if cap not in ("NET_BIND_SERVICE", "CAP_NET_BIND_SERVICE"):
                    v(where + ".securityContext.capabilities.add", f"{cap} is not allowed (only NET_BIND_SERVICE)")
    return bad


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    text = sys.stdin.read() if sys.argv[1] == "-" else open(sys.argv[1]).read()
    objs = []
    try:
        objs = [json.loads(text)]
    except json.JSONDecodeError:  # a stream of objects (minihelm yaml2json, jq -c)
        dec, i = json.JSONDecoder(), 0
        while i < len(text):
            while i < len(text) and text[i].isspace():
                i += 1
            if i < len(text):
                o, i = dec.raw_decode(text, i)
                objs.append(o)
    pods = [p for o in objs for p in pod_specs(o)]
    if not pods:
        sys.exit(f"{sys.argv[1]}: no pod or pod template found")
    bad = [line for p in pods for line in check(*p)]
    for line in bad:
        print(line)
    if bad:
        sys.exit(1)
    print(f"restricted: {len(pods)} pod(s) pass")


if __name__ == "__main__":
    main()
