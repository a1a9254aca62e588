"""Flash checkpoints for PyTorch programs run by Railyard (docs/programs.md "Flash checkpoints").

Two lines to restore, one to save:

    from railyard_flash import Checkpoint
    ckpt = Checkpoint(replicated=True)                    # DDP: every rank holds the same state
    start = ckpt.load({"model": model, "opt": opt}) + 1   # after init_process_group; 0 = nothing to restore
    for step in range(start, steps + 1):
        ...
        ckpt.save(step, {"model": model, "opt": opt})     # blocks only for a copy into shared memory

`save` copies every tensor of the objects' state_dict() into this rank's slot in the pod's shared memory (the agent's
in-memory tier: it outlives the process, the agent copies it to the next pod, and a replacement pod fetches it back),
then returns; a background thread checksums the slot and, every RAILYARD_CHECKPOINT_INTERVAL_STEPS, writes it to
RAILYARD_CHECKPOINT_DIR/flash/step-<N>/rank-<R>.img. `load` restores the newest step that every rank holds in memory
(its own slots, or copies the agent fetched from a peer) and that is at least as new as the newest complete step on
disk, else that disk step, and calls load_state_dict on each object.

Nothing to install: the Railyard agent writes this file and puts its folder on PYTHONPATH. Pure Python and torch.

The slot is a shared-memory image in the layout of Railyard's C++ ShmStore (checkpoint/shm_store.cc), format
version 2 (zlib's CRC-32 instead of CRC32C), so the agent's peer copy moves and verifies it byte for byte:
  0    magic "RYCKSHM1"           8 bytes
  8    version u32 = 2
  12   state u32                  1 writing (torn until sealed), 2 complete; written last
  16   generation u64             +1 per write of the slot
  24   step i64
  32   meta_bytes u64             JSON at offset 4096
  40   data_offset u64            4096-aligned, after the JSON
  48   data_bytes u64
  56   crc u32                    CRC-32 of the JSON, then of the data
  60   header_crc u32             CRC-32 of bytes 0..59 with state = 2
The JSON: {"tensors": [{"name", "dtype", "shape"}], "slices": [{"tensor", "offset", "size", "at", "bytes"}],
"state": {"flash": {...}}}: each tensor is stored whole and dense (offset zeros, size = shape, "at" relative to
data_offset, 64-byte aligned); "flash" holds the pickled structure of the state (tensors replaced by their index),
each tensor's torch dtype, the rank, the world size and whether the state is replicated.
"""
import base64
import json
import mmap
import os
import pickle
import struct
import sys
import threading
import time
import zlib

# Environment contract (common/flash_checkpoint.h names the same variables for the agent and the operator).
ENV_SHM_PREFIX = "RAILYARD_SHM_PREFIX"
ENV_PEER_STEPS = "RAILYARD_SHM_PEER_STEPS"
ENV_CHECKPOINT_DIR = "RAILYARD_CHECKPOINT_DIR"
ENV_INTERVAL = "RAILYARD_CHECKPOINT_INTERVAL_STEPS"
ENV_MEMORY_INTERVAL = "RAILYARD_CHECKPOINT_MEMORY_INTERVAL_STEPS"
ENV_KEEP = "RAILYARD_CHECKPOINT_KEEP"
ENV_RESTORE = "RAILYARD_RESTORE"
ENV_GENERATION = "RAILYARD_GENERATION"

MAGIC = b"RYCKSHM1"
VERSION = 2
STATE_WRITING = 1
STATE_COMPLETE = 2
HEADER_BYTES = 4096
_HEADER = struct.Struct("<8sIIQqQQQII")  # the fields above, 64 bytes
_HEADER_CRC_AT = 60

# torch dtype name -> the C++ format's dtype name (others are stored as bytes, "u8", and typed by the "flash" entry).
_CPP_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64", "int32": "i32",
              "int64": "i64", "uint8": "u8", "int8": "i8"}


def _align(v, a):
    return (v + a - 1) // a * a


def _log(msg, **kv):
    fields = " ".join(f"{k}={v}" for k, v in kv.items())
    print(f"railyard_flash: {msg}" + (" " + fields if fields else ""), file=sys.stderr, flush=True)


def header_crc(fields):
    """CRC-32 of the header's first 60 bytes with the state word set to complete. fields: the 10 header values."""
    f = list(fields)
    f[2] = STATE_COMPLETE
    f[9] = 0
    return zlib.crc32(_HEADER.pack(*f)[:_HEADER_CRC_AT])


def read_header(buf, size=None):
    """(step, fields) of a complete, well-formed version-2 image whose first bytes are buf and whose whole size is
    `size` (default len(buf)), or (None, reason)."""
    size = len(buf) if size is None else size
    if len(buf) < _HEADER.size or size < HEADER_BYTES:
        return None, "smaller than its header: torn or never written"
    f = _HEADER.unpack_from(buf, 0)
    magic, version, state, _gen, step, meta_bytes, data_offset, data_bytes, _crc, hcrc = f
    if magic != MAGIC:
        return None, "bad magic: not a railyard snapshot"
    if version != VERSION:
        return None, f"format version {version} (the built-in trainer's), not a flash checkpoint"
    if state != STATE_COMPLETE:
        return None, "torn: a writer started but did not finish"
    if hcrc != header_crc(f):
        return None, "torn: header checksum mismatch"
    if meta_bytes > size - HEADER_BYTES or data_offset < HEADER_BYTES + meta_bytes or \
            data_offset > size or data_bytes > size - data_offset:
        return None, "header sizes exceed the image"
    return step, f


def write_image_raw(buf, step, generation, tensors, state):
    """Writes a complete image into buf (writable, large enough: see image_size) without torch.

    tensors: [(name, cpp_dtype, shape, bytes-like)]; state: JSON-able. For tests and tools; the Checkpoint class does
    the same with torch tensors copied straight into the mapping."""
    meta, offsets, total = image_layout([(n, d, s, len(b)) for n, d, s, b in tensors], state)
    _begin(buf, generation)
    buf[HEADER_BYTES:HEADER_BYTES + len(meta)] = meta
    data_offset = _align(HEADER_BYTES + len(meta), 4096)
    for (_n, _d, _s, b), at in zip(tensors, offsets):
        buf[data_offset + at:data_offset + at + len(b)] = bytes(b)
    seal(buf, step, generation, len(meta), data_offset, total - data_offset)


def image_layout(entries, state, cache=None):
    """(meta JSON bytes, each tensor's offset in the data section, total image size) for [(name, dtype, shape, nbytes)].
    cache: a dict kept by the caller; the tensors' part of the JSON is reused while the entries stay the same."""
    key = tuple((n, d, tuple(s), b) for n, d, s, b in entries)
    hit = cache.get(key) if cache is not None else None
    if hit is None:
        tensors, slices, at, offsets = [], [], 0, []
        for name, dtype, shape, nbytes in entries:
            tensors.append({"name": name, "dtype": dtype, "shape": list(shape)})
            slices.append({"tensor": name, "offset": [0] * len(shape), "size": list(shape), "at": at, "bytes": nbytes})
            offsets.append(at)
            at = _align(at + nbytes, 64)
        part = json.dumps({"tensors": tensors, "slices": slices}, separators=(",", ":"))[:-1]  # without the '}'
        hit = (part.encode(), offsets, at)
        if cache is not None:
            cache.clear()
            cache[key] = hit
    part, offsets, data_bytes = hit
    meta = part + b',"state":' + json.dumps(state, separators=(",", ":")).encode() + b"}"
    return meta, offsets, _align(HEADER_BYTES + len(meta), 4096) + data_bytes


def _begin(buf, generation):
    """Marks the image torn (state word first) with its new generation, before any other byte changes."""
    struct.pack_into("<I", buf, 12, STATE_WRITING)
    struct.pack_into("<Q", buf, 16, generation)


def seal(buf, step, generation, meta_bytes, data_offset, data_bytes):
    """Checksums the contents and writes the header, the state word (complete) last."""
    mv = memoryview(buf)
    crc = zlib.crc32(mv[HEADER_BYTES:HEADER_BYTES + meta_bytes])
    crc = zlib.crc32(mv[data_offset:data_offset + data_bytes], crc)  # releases the GIL: training goes on meanwhile
    f = [MAGIC, VERSION, STATE_WRITING, generation, step, meta_bytes, data_offset, data_bytes, crc, 0]
    f[9] = header_crc(f)
    hdr = _HEADER.pack(*f)
    buf[16:_HEADER.size] = hdr[16:]  # everything but magic, version and the state word
    buf[0:12] = hdr[0:12]
    struct.pack_into("<I", buf, 12, STATE_COMPLETE)
    mv.release()


def verify(buf):
    """(step, meta dict) of a complete image whose contents match their CRC-32, or (None, reason)."""
    step, f = read_header(buf)
    if step is None:
        return None, f
    _m, _v, _s, _g, _st, meta_bytes, data_offset, data_bytes, crc, _h = f
    mv = memoryview(buf)
    got = zlib.crc32(mv[data_offset:data_offset + data_bytes], zlib.crc32(mv[HEADER_BYTES:HEADER_BYTES + meta_bytes]))
    if got != crc:
        mv.release()
        return None, f"CRC-32 mismatch over the contents (step {step})"
    try:
        meta = json.loads(bytes(mv[HEADER_BYTES:HEADER_BYTES + meta_bytes]))
    except ValueError as e:
        mv.release()
        return None, f"metadata is not JSON: {e}"
    mv.release()
    return step, meta


class _Slot:
    """One shared-memory segment /dev/shm/<prefix>-r<rank>-<a|b>, mapped read-write and kept mapped."""

    def __init__(self, name):
        self.name = name  # POSIX name, "/railyard-..."
        self.path = "/dev/shm" + name
        self.map = None

    def peek(self):
        """The step of a complete image in the segment (header only), or (None, reason)."""
        try:
            with open(self.path, "rb") as f:
                hdr = f.read(HEADER_BYTES)
                size = os.fstat(f.fileno()).st_size
        except OSError as e:
            return None, f"no snapshot ({e.strerror})"
        if len(hdr) < HEADER_BYTES:
            return None, "smaller than its header: torn or never written"
        step, f = read_header(hdr, size)
        return (step, None) if step is not None else (None, f)

    def mapping(self, size):
        """The segment mapped read-write, at least `size` bytes, its pages reserved (a full /dev/shm is an error
        here, not a SIGBUS in the middle of a copy)."""
        if self.map is not None and len(self.map) >= size:
            return self.map
        if self.map is not None:
            self.map.close()
            self.map = None
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < size:
                try:
                    os.posix_fallocate(fd, 0, size)
                except OSError as e:
                    raise RuntimeError(f"railyard_flash: cannot reserve {size} bytes in {self.path}: {e.strerror} "
                                       "(is /dev/shm large enough? a pod's /dev/shm is sized by its memory limit)")
            self.map = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        return self.map

    def generation(self):
        return struct.unpack_from("<Q", self.map, 16)[0] if self.map is not None and len(self.map) >= 64 else 0

    def read(self):
        """The segment mapped read-only (no save runs while a rank restores)."""
        return _map_file(self.path)


def _map_file(path):
    """The file (a slot in /dev/shm, or a checkpoint file) mapped read-only: restoring reads it in place, without
    allocating a private copy (fresh pages cost more than the copy itself on some VMs: docs/benchmarks.md)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)


def _same_kind(obj, items):
    """A dict of obj's type (an OrderedDict stays one, with the _metadata a module's state_dict carries)."""
    try:
        out = type(obj)(items)
    except TypeError:
        out = dict(items)
    if hasattr(obj, "_metadata"):
        out._metadata = obj._metadata
    return out


def _flatten(obj, tensors):
    """obj with every tensor replaced by ("__railyard_tensor__", index), tensors appended to `tensors`."""
    import torch
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return ("__railyard_tensor__", len(tensors) - 1)
    if isinstance(obj, dict):
        return _same_kind(obj, [(k, _flatten(v, tensors)) for k, v in obj.items()])
    if isinstance(obj, list):
        return [_flatten(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_flatten(v, tensors) for v in obj)
    return obj


def _unflatten(obj, tensors):
    if isinstance(obj, tuple) and len(obj) == 2 and obj[0] == "__railyard_tensor__":
        return tensors[obj[1]]
    if isinstance(obj, dict):
        return _same_kind(obj, [(k, _unflatten(v, tensors)) for k, v in obj.items()])
    if isinstance(obj, list):
        return [_unflatten(v, tensors) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_unflatten(v, tensors) for v in obj)
    return obj


def _clone_tensors(obj):
    """obj with every tensor in it replaced by a copy."""
    import torch
    if torch.is_tensor(obj):
        return obj.clone()
    if isinstance(obj, dict):
        return _same_kind(obj, [(k, _clone_tensors(v)) for k, v in obj.items()])
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone_tensors(v) for v in obj)
    return obj


def _state_of(objs):
    return {k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in objs.items()}


def _int_env(name, default):
    v = os.environ.get(name, "")
    try:
        return int(v) if v.strip() else default
    except ValueError:
        raise ValueError(f"railyard_flash: {name}={v!r} is not an integer")


class Checkpoint:
    """A rank's flash checkpoints. replicated=True: every rank holds the same state (DDP), so one copy (rank 0's) goes
    to disk and any world size restores from it; False: each rank's state is its own shard (FSDP, tensor parallel),
    every rank writes its file, and a restore needs the same world size."""

    def __init__(self, replicated=False, directory=None, memory_every=None, disk_every=None, keep=None):
        self.rank = _int_env("RANK", 0)
        self.world = _int_env("WORLD_SIZE", 1)
        self.replicated = bool(replicated)
        prefix = os.environ.get(ENV_SHM_PREFIX, "") or f"/railyard-flash-{os.getuid()}"
        if not prefix.startswith("/") or "/" in prefix[1:]:
            raise ValueError(f"railyard_flash: {ENV_SHM_PREFIX}={prefix!r} must be '/' followed by a name without '/'")
        self.slots = [_Slot(f"{prefix}-r{self.rank}-{s}") for s in ("a", "b")]
        self.directory = directory if directory is not None else os.environ.get(ENV_CHECKPOINT_DIR, "")
        self.disk_every = disk_every if disk_every is not None else _int_env(ENV_INTERVAL, 0)
        self.memory_every = memory_every if memory_every is not None else _int_env(ENV_MEMORY_INTERVAL, 1)
        self.keep = max(1, keep if keep is not None else _int_env(ENV_KEEP, 3))
        self.peer_steps = {int(s) for s in os.environ.get(ENV_PEER_STEPS, "").split(",") if s.strip()}
        self.restored_from = None
        self.extra = None
        self._held = ""
        self.stats = {"saves": 0, "skipped": 0, "blocked_seconds": 0.0, "last_blocked_seconds": 0.0,
                      "persisted": 0, "persist_errors": 0, "last_persist_seconds": 0.0}
        self._layout_cache = {}
        self._cv = threading.Condition()
        self._seal_job = None     # the snapshot being checksummed (one at a time: save waits for it)
        self._persist_job = None  # the sealed snapshot being written to disk (its slot is pinned meanwhile)
        self._pinned = None
        self._error = None
        self._closed = False
        # Two threads, so that a slow write to disk never holds up the checksum of the next memory snapshot.
        self._threads = [threading.Thread(target=f, name=n, daemon=True)
                         for f, n in ((self._sealer, "railyard-flash-seal"), (self._persister, "railyard-flash-disk"))]
        for t in self._threads:
            t.start()

    # ----- saving ---------------------------------------------------------------------------------------------
    def save(self, step, objs, extra=None, force=False):
        """Snapshots objs ({name: module, optimizer or state dict}) and `extra` (anything picklable: RNG, data
        position) at `step` when it is a memory or disk step (or force). Returns True when a snapshot was taken.
        Blocks only while the tensors are copied (and while the previous snapshot is still being checksummed)."""
        step = int(step)
        to_disk = bool(self.directory) and self.disk_every > 0 and step % self.disk_every == 0
        to_memory = self.memory_every > 0 and step % self.memory_every == 0
        if not (force or to_disk or to_memory):
            return False
        t0 = time.perf_counter()
        import torch
        with self._cv:
            while self._seal_job is not None:
                self._cv.wait()
            if self._error is not None:
                err, self._error = self._error, None
                _log("a write to disk failed; the previous complete step stays", error=err)
            if to_disk and self._persist_job is not None:
                _log("the previous step is still being written to disk: this step stays in memory only", step=step)
                self.stats["skipped"] += 1
                to_disk = False
            target = self._choose_slot()
        tensors = []
        skeleton = _flatten(_state_of(objs), tensors)
        entries, kinds = [], []
        for i, t in enumerate(tensors):
            name = str(t.dtype).replace("torch.", "")
            cpp = _CPP_DTYPE.get(name)
            nbytes = t.numel() * t.element_size()
            entries.append((f"t{i}", cpp or "u8", list(t.shape) if cpp else [nbytes], nbytes))
            kinds.append((name, list(t.shape)))
        flash = {"skeleton": base64.b64encode(pickle.dumps(skeleton, protocol=4)).decode(),
                 "extra": base64.b64encode(pickle.dumps(extra, protocol=4)).decode(),
                 "dtypes": kinds, "rank": self.rank, "world_size": self.world, "replicated": self.replicated}
        meta, offsets, total = image_layout(entries, {"flash": flash}, self._layout_cache)
        slot = self.slots[target]
        buf = slot.mapping(total)
        generation = slot.generation() + 1
        _begin(buf, generation)
        buf[HEADER_BYTES:HEADER_BYTES + len(meta)] = meta
        data_offset = _align(HEADER_BYTES + len(meta), 4096)
        for t, at, (_n, _d, _s, nbytes) in zip(tensors, offsets, entries):
            if nbytes == 0:
                continue
            src = t.detach().reshape(-1)
            if not src.is_contiguous():
                src = src.contiguous()
            src = src.to(torch.uint8) if src.dtype == torch.bool else src.view(torch.uint8)
            dst = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=data_offset + at)
            dst.copy_(src)  # from a GPU tensor: the device-to-host copy
            del dst
        with self._cv:
            self._seal_job = (target, step, len(meta), data_offset, total - data_offset, generation, to_disk)
            self._cv.notify_all()
        took = time.perf_counter() - t0
        self.stats["saves"] += 1
        self.stats["blocked_seconds"] += took
        self.stats["last_blocked_seconds"] = took
        return True

    def _choose_slot(self):
        """The slot for the next snapshot: the one not holding the newest complete step, unless it is being written
        to disk (then the newest's own: while that is rewritten, the pinned one is the fallback)."""
        steps = [s.peek()[0] for s in self.slots]
        newest = max((i for i in range(2) if steps[i] is not None), key=lambda i: steps[i], default=None)
        target = 0 if newest is None else 1 - newest
        if self._pinned == target:
            target = 1 - target
        return target

    def wait(self, timeout=None):
        """Waits until every snapshot taken so far is checksummed and, where due, on disk. True when done."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._seal_job is not None or self._persist_job is not None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def close(self):
        """Waits for the snapshots in flight (see wait) and stops the threads."""
        self.wait()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for t in self._threads:
            t.join()

    def _sealer(self):
        while True:
            with self._cv:
                while self._seal_job is None and not self._closed:
                    self._cv.wait()
                if self._seal_job is None:
                    return
                target, step, meta_bytes, data_offset, data_bytes, generation, to_disk = self._seal_job
            seal(self.slots[target].map, step, generation, meta_bytes, data_offset, data_bytes)
            with self._cv:
                self._seal_job = None
                if to_disk and (not self.replicated or self.rank == 0):
                    self._pinned = target
                    self._persist_job = (target, step, data_offset + data_bytes)
                self._cv.notify_all()

    def _persister(self):
        while True:
            with self._cv:
                while self._persist_job is None and not self._closed:
                    self._cv.wait()
                if self._persist_job is None:
                    return
                target, step, size = self._persist_job
            t0 = time.perf_counter()
            try:
                self._persist(self.slots[target], step, size)
                self.stats["persisted"] += 1
            except Exception as e:  # never into the training loop: logged at the next save
                self.stats["persist_errors"] += 1
                with self._cv:
                    self._error = f"step {step}: {e}"
            self.stats["last_persist_seconds"] = time.perf_counter() - t0
            with self._cv:
                self._persist_job = None
                self._pinned = None
                self._cv.notify_all()

    def _persist(self, slot, step, size):
        d = os.path.join(self.directory, "flash", f"step-{step:08d}")
        os.makedirs(d, exist_ok=True)
        final = os.path.join(d, f"rank-{self.rank:05d}.img")
        tmp = f"{final}.tmp-{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            mv = memoryview(slot.map)
            at = 0
            while at < size:
                at += os.write(fd, mv[at:min(size, at + (64 << 20))])
            mv.release()
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        self._retain()

    def _retain(self):
        """Removes this rank's files of steps older than the newest `keep` complete steps (a step is complete when
        every file it needs is there, so one still being written by another rank never counts)."""
        complete = complete_steps(self.directory)
        if len(complete) <= self.keep:
            return
        floor = complete[-self.keep]
        root = os.path.join(self.directory, "flash")
        for name in os.listdir(root):
            if not name.startswith("step-"):
                continue
            try:
                s = int(name[5:])
            except ValueError:
                continue
            if s >= floor:
                continue
            p = os.path.join(root, name)
            for f in os.listdir(p):
                if f.startswith(f"rank-{self.rank:05d}.img"):
                    os.remove(os.path.join(p, f))
            try:
                os.rmdir(p)
            except OSError:
                pass

    # ----- restoring ------------------------------------------------------------------------------------------
    def load(self, objs):
        """Restores objs from the newest step every rank can load (memory, then disk) and returns it; 0 when there is
        nothing to restore or the job's first generation starts fresh. Call after init_process_group."""
        import torch.distributed as dist
        if _int_env(ENV_GENERATION, 0) == 1:
            return 0  # a job's first generation starts fresh, even over an earlier job's files of the same path
        multi = self.world > 1
        if multi and not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("railyard_flash: Checkpoint.load() with WORLD_SIZE > 1 needs the process group: call "
                               "torch.distributed.init_process_group() first")

        def gather(v):
            if not multi:
                return [v]
            out = [None] * self.world
            dist.all_gather_object(out, v)
            return out

        mine = {}
        for i, s in enumerate(self.slots):
            step, _ = s.peek()
            if step is not None:
                mine[step] = i
        disk = complete_steps(self.directory) if self.directory else []
        views = gather((sorted(mine), disk[-1] if disk else 0))
        common = set(views[0][0]).intersection(*[set(v[0]) for v in views[1:]])
        floor = max(v[1] for v in views)
        # What each rank held, for the restore's log line: why this step and not another is then plain to see.
        self._held = ",".join("/".join(str(x) for x in v[0]) or "-" for v in views) + f" disk={floor}"
        t0 = time.perf_counter()
        for step in sorted((s for s in common if s >= floor), reverse=True):
            state, why = self._try(lambda: self.slots[mine[step]].read(), step)
            if all(ok for ok, _ in gather((state is not None, why))):
                self.restored_from = "peer" if step in self.peer_steps else "memory"
                return self._apply(objs, state, step, t0)
            _log("a rank could not load the in-memory step; trying older", step=step, why=why)
        if floor > 0:
            owner = 0 if self._disk_replicated(floor) else self.rank
            path = os.path.join(self.directory, "flash", f"step-{floor:08d}", f"rank-{owner:05d}.img")
            state, why = self._try(lambda: _map_file(path), floor)
            oks = gather((state is not None, why))
            if all(ok for ok, _ in oks):
                self.restored_from = "disk"
                return self._apply(objs, state, floor, t0)
            raise RuntimeError(f"railyard_flash: the newest complete step {floor} on disk does not load: "
                               + "; ".join(f"rank {r}: {w}" for r, (ok, w) in enumerate(oks) if not ok))
        if any(v[0] for v in views):
            _log("no step that every rank holds and none on disk: starting from step 1", held=self._held)
        return 0

    def _disk_replicated(self, step):
        p = os.path.join(self.directory, "flash", f"step-{step:08d}", "rank-00000.img")
        try:
            with open(p, "rb") as f:
                _s, fl = read_header(f.read(HEADER_BYTES), os.fstat(f.fileno()).st_size)
                if _s is None:
                    return False
                f.seek(HEADER_BYTES)
                meta = json.loads(f.read(fl[5]))
            return bool(meta["state"]["flash"]["replicated"])
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def _try(self, read, step):
        """(the decoded state, None), or (None, why) when the bytes do not verify or are not this job's layout."""
        try:
            buf = read()
        except OSError as e:
            return None, str(e)
        got, meta = verify(buf)
        if got is None:
            return None, meta
        if got != step:
            return None, f"holds step {got}, not {step}"
        flash = meta.get("state", {}).get("flash")
        if not isinstance(flash, dict):
            return None, "not a flash checkpoint"
        if not flash.get("replicated") and flash.get("world_size") != self.world:
            return None, (f"saved by a world of {flash.get('world_size')} ranks, this one has {self.world} (only a "
                          "replicated=True checkpoint restores into another world size)")
        return (buf, meta), None

    def _apply(self, objs, state, step, t0):
        import warnings
        import torch
        buf, meta = state
        flash = meta["state"]["flash"]
        data_offset = read_header(buf)[1][6]
        tensors = []
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns that the read-only mapping is not writable: nothing writes it
            for sl, (dtype, shape) in zip(meta["slices"], flash["dtypes"]):
                n = sl["bytes"]
                raw = torch.frombuffer(buf, dtype=torch.uint8, count=n, offset=data_offset + sl["at"]) \
                    if n else torch.empty(0, dtype=torch.uint8)
                dt = getattr(torch, dtype)
                t = raw.to(torch.bool) if dt == torch.bool else raw.view(dt)
                tensors.append(t.reshape(shape))
        restored = _unflatten(pickle.loads(base64.b64decode(flash["skeleton"])), tensors)
        # The tensors are views of the mapping, which a later save overwrites (a slot) or which goes away: nothing may
        # keep one. A module copies into its own parameters; an optimizer may keep what it is given (torch 2 keeps
        # same-dtype tensors as they are; 1.13 deep-copies), so what it kept of the mapping is copied afterwards; any
        # other object gets copies.
        lo = tensors[0].data_ptr() - data_offset - meta["slices"][0]["at"] if tensors else 0
        hi = lo + len(buf)
        for k, obj in objs.items():
            if k not in restored:
                raise KeyError(f"railyard_flash: step {step} holds no '{k}' (it holds {sorted(restored)})")
            if not hasattr(obj, "load_state_dict"):
                continue
            if isinstance(obj, torch.nn.Module):
                obj.load_state_dict(restored[k])
            elif isinstance(obj, torch.optim.Optimizer):
                obj.load_state_dict(restored[k])
                for st in obj.state.values():
                    for key, v in list(st.items()):
                        if torch.is_tensor(v) and v.numel() and lo <= v.data_ptr() < hi:
                            st[key] = v.clone()
            else:
                obj.load_state_dict(_clone_tensors(restored[k]))
        self.extra = pickle.loads(base64.b64decode(flash["extra"]))
        del restored, tensors
        if isinstance(buf, mmap.mmap):
            try:
                buf.close()
            except BufferError:  # a view still referenced somewhere: the mapping goes with it
                pass
        _log("restored", step=step, **{"from": self.restored_from},
             seconds=f"{time.perf_counter() - t0:.3f}", held=self._held)
        return step


def complete_steps(directory):
    """The steps under directory/flash whose every needed file is there (rank 0's for a replicated checkpoint,
    else one per rank of the world that saved it), oldest first."""
    root = os.path.join(directory, "flash")
    try:
        names = os.listdir(root)
    except OSError:
        return []
    out = []
    for name in names:
        if not name.startswith("step-"):
            continue
        try:
            step = int(name[5:])
        except ValueError:
            continue
        d = os.path.join(root, name)
        files = [f for f in os.listdir(d) if f.startswith("rank-") and f.endswith(".img")]
        if not files:
            continue
        try:
            with open(os.path.join(d, sorted(files)[0]), "rb") as f:
                s, fl = read_header(f.read(HEADER_BYTES), os.fstat(f.fileno()).st_size)
                if s is None:
                    continue
                f.seek(HEADER_BYTES)
                flash = json.loads(f.read(fl[5]))["state"]["flash"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        need = 1 if flash.get("replicated") else int(flash.get("world_size", 1))
        if flash.get("replicated"):
            ok = "rank-00000.img" in files
        else:
            ok = all(f"rank-{r:05d}.img" in files for r in range(need))
        if ok:
            out.append(step)
    return sorted(out)
