#!/usr/bin/env python3
"""Assembles an OCI image-layout tarball from a Dockerfile's runtime stage, without a registry or a daemon.

The runtime stage of deploy/docker/Dockerfile.* is read for what the image is (its COPY --from=build files, USER,
ENV, WORKDIR, ENTRYPOINT and CMD); the files come from this checkout's own build (the same Debian 12 toolchain the
Dockerfile's build stage uses), and the base layer is a root filesystem that deploy/images/build.sh made with
debootstrap from the packages the stage's `apt-get install` names. The output imports with
`ctr -n k8s.io images import FILE` (containerd) and is what `docker build` would produce up to file timestamps.

  oci_image.py parse DOCKERFILE                 print the runtime stage as JSON (packages, copies, config)
  oci_image.py build --dockerfile F --base-layer BASE.tar.gz --build-dir B --name REF --out OUT.tar
                     [--extra SRC:DEST ...]     (extra files, e.g. the CUDA module, added to the app layer)
  oci_image.py pause --binary PAUSE --name REF --out OUT.tar     the pod sandbox image: one static binary
"""
import argparse
import gzip
import hashlib
import io
import json
import os
import re
import shlex
import sys
import tarfile
import time


def flat_instructions(path):
    """The Dockerfile as (INSTRUCTION, rest) pairs, continuation lines joined and comments dropped."""
    lines, cur = [], ""
    with open(path) as f:
        for raw in f:
            line = raw.rstrip("\n")
            if not cur and line.lstrip().startswith("#"):
                continue
            if line.endswith("\\"):
                cur += line[:-1] + " "
                continue
            cur += line
            if cur.strip():
                word, _, rest = cur.strip().partition(" ")
                lines.append((word.upper(), rest.strip()))
            cur = ""
    return lines


def parse(path):
    ins = flat_instructions(path)
    froms = [i for i, (w, _) in enumerate(ins) if w == "FROM"]
    if not froms:
        sys.exit(f"{path}: no FROM")
    # Multi-stage (Railyard's images: binaries COPY --from=build) or one stage (an example's image: files COPYed from
    # the Dockerfile's own directory, its build context).
    single = len(froms) == 1
    stage = ins[froms[-1] + 1:]
    out = {"packages": [], "copies": [], "user": "", "env": [], "workdir": "", "entrypoint": None, "cmd": None}
    for word, rest in stage:
        if word == "RUN" and "apt-get install" in rest:
            cmd = rest.split("apt-get install", 1)[1].split("&&", 1)[0]
            out["packages"] += [t for t in cmd.split() if re.fullmatch(r"[a-z0-9][a-z0-9.+-]+", t)]
        elif word == "COPY":
            toks = shlex.split(rest)
            if single and toks and not toks[0].startswith("--"):
                for src in toks[:-1]:
                    out["copies"].append(["context:" + src, toks[-1]])
                continue
            if not toks or not toks[0].startswith("--from=build"):
                sys.exit(f"{path}: runtime stage COPY without --from=build is not supported: COPY {rest}")
            srcs, dest = toks[1:-1], toks[-1]
            for s in srcs:
                if not s.startswith("/src/"):
                    sys.exit(f"{path}: COPY --from=build source {s} is not under /src/ (the checkout)")
                out["copies"].append([s[len("/src/"):], dest])
        elif word == "USER":
            out["user"] = rest
        elif word == "ENV":
            k, _, v = rest.partition("=")
            out["env"].append(f"{k.strip()}={v.strip()}")
        elif word == "WORKDIR":
            out["workdir"] = rest
        elif word in ("ENTRYPOINT", "CMD"):
            out[word.lower()] = json.loads(rest)
        elif word in ("ARG", "LABEL", "EXPOSE"):
            pass
        elif word == "RUN":
            sys.exit(f"{path}: only `RUN apt-get install` is supported in the runtime stage: RUN {rest}")
    if not out["packages"]:
        sys.exit(f"{path}: the runtime stage installs no packages")
    return out


def add_bytes(tf, name, data, mode=0o644):
    ti = tarfile.TarInfo(name)
    ti.size, ti.mode, ti.mtime = len(data), mode, 0
    tf.addfile(ti, io.BytesIO(data))


def add_dirs(tf, path, seen):
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d in seen:
            continue
        seen.add(d)
        ti = tarfile.TarInfo(d)
        ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 0
        tf.addfile(ti)


def app_layer(files):
    """files: [(host_path, image_path)] -> gzipped tar bytes, deterministic (mtime 0, root-owned, sorted)."""
    raw = io.BytesIO()
    seen = set()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for host, dest in sorted(files, key=lambda f: f[1]):
            add_dirs(tf, dest, seen)
            st = os.stat(host)
            with open(host, "rb") as f:
                add_bytes(tf, dest.lstrip("/"), f.read(), 0o755 if st.st_mode & 0o111 else 0o644)
    return raw.getvalue()


def gz(data):
    return gzip.compress(data, compresslevel=6, mtime=0)


def write_image(layers, config, name, out):
    """layers: [(gzipped tar bytes, uncompressed digest)]; writes an OCI image-layout tarball named `name`."""
    blobs = {}

    def blob(data):
        d = "sha256:" + hashlib.sha256(data).hexdigest()
        blobs[d] = data
        return d, len(data)

    descs = []
    for data, _ in layers:
        d, n = blob(data)
        descs.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": n})
    config = dict(config, architecture="amd64", os="linux",
                  rootfs={"type": "layers", "diff_ids": [diff for _, diff in layers]})
    c_d, c_n = blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": c_d, "size": c_n},
        "layers": descs,
    }
    m_d, m_n = blob(json.dumps(manifest, sort_keys=True).encode())
    index = {"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m_d, "size": m_n,
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}}]}
    tmp = out + ".tmp"
    with tarfile.open(tmp, "w") as tf:
        add_bytes(tf, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        add_bytes(tf, "index.json", json.dumps(index).encode())
        for d, data in blobs.items():
            add_bytes(tf, "blobs/sha256/" + d.split(":")[1], data)
    os.replace(tmp, out)
    return {"name": name, "manifest": m_d, "compressed_bytes": sum(d["size"] for d in descs)}


def build(a):
    spec = parse(a.dockerfile)
    files = []
    for src, dest in spec["copies"]:
        if src.startswith("context:"):
            host = os.path.join(os.path.dirname(os.path.abspath(a.dockerfile)), src[len("context:"):])
            if not os.path.isfile(host):
                sys.exit(f"{a.dockerfile}: COPY {src[len('context:'):]}: {host} is not a file")
            files.append((host, dest + os.path.basename(host) if dest.endswith("/") else dest))
            continue
        if not src.startswith("build/"):
            sys.exit(f"{a.dockerfile}: COPY --from=build {src}: only files under /src/build/ come from the build")
        host = os.path.join(a.build_dir, src[len("build/"):])
        if not os.path.isfile(host):
            sys.exit(f"{host} is missing: build it first (cmake --build build --target {os.path.basename(src)})")
        files.append((host, dest + os.path.basename(src) if dest.endswith("/") else dest))
    for e in a.extra or []:
        s, _, d = e.partition(":")
        if not os.path.isfile(s):
            sys.exit(f"--extra {e}: {s} is not a file")
        files.append((s, d))
    app_raw = app_layer(files)
    with open(a.base_layer, "rb") as f:
        base_gz = f.read()
    base_diff = open(a.base_layer + ".diffid").read().strip()
    config = {"config": {
        "User": spec["user"],
        "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + spec["env"],
        "Entrypoint": spec["entrypoint"],
        "Cmd": spec["cmd"],
        "WorkingDir": spec["workdir"] or "/",
        "Labels": {"dev.railyard.dockerfile": os.path.basename(a.dockerfile)}},
        "history": [{"created_by": "debootstrap " + " ".join(spec["packages"])},
                    {"created_by": "COPY --from=build " + " ".join(s for s, _ in spec["copies"])}]}
    res = write_image([(base_gz, base_diff), (gz(app_raw), "sha256:" + hashlib.sha256(app_raw).hexdigest())],
                      config, a.name, a.out)
    print(json.dumps(res))


def pause(a):
    raw = app_layer([(a.binary, "/pause")])
    config = {"config": {"User": "65535:65535", "Entrypoint": ["/pause"], "WorkingDir": "/"}}
    print(json.dumps(write_image([(gz(raw), "sha256:" + hashlib.sha256(raw).hexdigest())], config, a.name, a.out)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("parse")
    pp.add_argument("dockerfile")
    pb = sub.add_parser("build")
    pb.add_argument("--dockerfile", required=True)
    pb.add_argument("--base-layer", required=True)
    pb.add_argument("--build-dir", required=True)
    pb.add_argument("--name", required=True)
    pb.add_argument("--out", required=True)
    pb.add_argument("--extra", action="append")
    pz = sub.add_parser("pause")
    pz.add_argument("--binary", required=True)
    pz.add_argument("--name", required=True)
    pz.add_argument("--out", required=True)
    a = p.parse_args()
    if a.cmd == "parse":
        print(json.dumps(parse(a.dockerfile)))
    elif a.cmd == "pause":
        pause(a)
    else:
        build(a)


if __name__ == "__main__":
    main()
