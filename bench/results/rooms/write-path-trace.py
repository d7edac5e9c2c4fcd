"""Call trees of one cached write (pwrite 512 B at offset 100, page 0 not in NVRAM) at two
revisions, and the metrics derived from them. A node: (file, function, [children]).
Files are relative to crates/. Order of children = order of execution (Rust evaluates call
arguments left to right before the call)."""
import json, sys

def N(f, fn, *kids):
    return (f, fn, list(kids))

# ---------- txn crate excursions (identical code at both revisions) ----------
def T_begin():
    return N("txn/src/pool.rs", "Pool::begin",
             N("txn/src/tx.rs", "Tx::new", N("txn/src/ranges.rs", "RangeSet::new")))
def T_snapshot():
    return N("txn/src/tx.rs", "Tx::snapshot",
             N("txn/src/undo.rs", "is_data_range"),
             N("txn/src/ranges.rs", "RangeSet::gaps"),
             N("txn/src/undo.rs", "record_size, slot_capacity, encode_record, encode_tail"),
             N("txn/src/ranges.rs", "RangeSet::insert"))
def T_write():
    return N("txn/src/tx.rs", "Tx::write",
             N("txn/src/undo.rs", "is_data_range"),
             N("txn/src/ranges.rs", "RangeSet::covers, insert"))
def T_alloc():
    return N("txn/src/tx.rs", "Tx::alloc_frame",
             T_snapshot(),
             N("txn/src/frames.rs", "encode_allocated"),
             T_write(),
             N("txn/src/ranges.rs", "RangeSet::insert"))
def T_fresh_write():
    return [N("txn/src/pool.rs", "Pool::frame_offset"), T_write()]
def T_update():
    return [N("txn/src/tx.rs", "Tx::pool"),
            N("txn/src/tx.rs", "Tx::update", T_snapshot(), T_write())]
def T_commit():
    return N("txn/src/tx.rs", "Tx::commit",
             N("txn/src/ranges.rs", "RangeSet::iter, is_empty"),
             N("txn/src/undo.rs", "encode_tail"),
             N("txn/src/pool.rs", "Pool::release_slot"))

# ---------- d87a06a ----------
def old(first_write=False):
    C = "core/src/"
    sync = C + "sync.rs"
    def cf_id():
        return N(C + "cache/state.rs", "CachedFile::id", N(C + "slots.rs", "Place::owner"))
    # cache_entry
    if not first_write:
        cache_entry = N(C + "cache/ops.rs", "Engine::cache_entry",
                        N(C + "cache/mod.rs", "PageCache::get", N(sync, "Mutex::lock")))
        extents = N(C + "cache/ops.rs", "Engine::extents (FIEMAP cached in the state)")
    else:
        cache_entry = N(C + "cache/ops.rs", "Engine::cache_entry",
            N(C + "cache/mod.rs", "PageCache::get", N(sync, "Mutex::lock")),
            N(C + "cache/mod.rs", "PageCache::stripe", N(sync, "Mutex::lock")),
            N(C + "cache/mod.rs", "PageCache::get", N(sync, "Mutex::lock")),
            N(C + "lowerfs.rs", "Lower::getattr", N(sync, "assert_may_block")),
            N(C + "lowerfs.rs", "Lower::file_handle", N(sync, "assert_may_block")),
            N(C + "slots.rs", "SlotList::lock, RecordSlots::reserve", N(sync, "Mutex::lock")),
            N(C + "engine/optx.rs", "OpTx::tx", N(sync, "Held::token"), T_begin()),
            N(C + "cache/record.rs", "Record::encode"),
            N(C + "slots.rs", "put_new, Place::offset", *T_update()),
            N(C + "engine/optx.rs", "OpTx::end", T_commit()),
            N(C + "slots.rs", "SlotList::lock, RecordSlots::settle_new", N(sync, "Mutex::lock")),
            N(C + "cache/mod.rs", "PageCache::new_file",
              N(C + "cache/state.rs", "CachedFile::new", N(sync, "Mutex::new"))),
            N(C + "cache/mod.rs", "PageCache::insert", N(sync, "Mutex::lock"), cf_id(),
              N(C + "cache/counters.rs", "inc")))
        extents = N(C + "cache/ops.rs", "Engine::extents",
            N(C + "cache/ops.rs", "Engine::cache_io"),
            N(C + "lowerfs.rs", "Lower::open", N(sync, "assert_may_block")),
            N(C + "cache/state.rs", "CachedFile::may_hold"),
            N(C + "lowerfs.rs", "Lower::fiemap", N(sync, "assert_may_block")))
    plan = N(C + "cache/nbw.rs", "Engine::plan_write",
        N(C + "tempfs/data.rs", "pieces (+ first next)"),
        extents,
        cf_id(),
        N(C + "cache/mod.rs", "PageCache::tables", N(sync, "Mutex::lock")),
        N(C + "cache/state.rs", "locate", N(C + "cache/policy/zones.rs", "ZoneTable::contains, zone_of")),
        N(C + "cache/patch.rs", "Patch::new, Patch::merge (apply, pieces, to_u16), Patch::slots"),
        N(C + "cache/nbw.rs", "Engine::patch_room (under the patch limit)"),
        N(C + "tempfs/data.rs", "pieces: next -> None"))
    put = N(C + "cache/patchframe.rs",
            "PatchFrames::put (place, best_fit; no room: fresh patch frame; mask, change_used, set_used, longest_free, change_at)",
            T_alloc(), *T_fresh_write())
    closure = N(C + "cache/ops.rs", "cached_write::{closure} (phase 2)",
        N(C + "engine/optx.rs", "OpTx::tx", N(sync, "Held::token"), T_begin()),
        N(C + "tempfs/data.rs", "pieces (no whole dirty page to update)"),
        cf_id(),
        N(C + "cache/nbw.rs", "Engine::write_plans",
          N(C + "cache/patch.rs", "Patch::encode (slots, run_sum)"),
          put),
        N(C + "cache/record.rs", "Record::encode"),
        N(C + "slots.rs", "put, Place::offset", *T_update()),
        N(C + "engine/optx.rs", "OpTx::end (commit)", T_commit()))
    mirror = N(C + "cache/ops.rs", "Engine::mirror_write",
        N(C + "cache/mod.rs", "PageCache::tick"),
        N(C + "cache/mod.rs", "PageCache::tables", N(sync, "Mutex::lock")),
        N(C + "cache/nbw.rs", "Plan::page, is_new, loc, loc"),
        N(C + "cache/policy/zones.rs", "ZoneTable::contains"),
        N(C + "cache/nbw.rs", "Plan::loc"),
        cf_id(),
        N(C + "cache/state.rs", "add_page",
          N(C + "cache/policy/zones.rs", "all.add_to_zone (zone_of, present_in, prev, next)"),
          N(C + "cache/counters.rs", "inc(pages_dirty)"),
          N(C + "cache/policy/zones.rs", "inactive.add_to_zone"),
          N(C + "cache/counters.rs", "inc(pages_inactive_dirty)")),
        N(C + "cache/counters.rs", "inc(patches_created), NbwCounters::patch_added"),
        cf_id(),
        N(C + "cache/nbw.rs", "Engine::queue_fetches",
          N(sync, "Mutex::lock (fetches)"),
          N(C + "cache/fetchqueue.rs", "FetchQueue::len, push, len"),
          N(sync, "Bell::ring (fetcher_bell)")))
    cached_write = N(C + "cache/ops.rs", "Engine::cached_write",
        N(C + "cache/state.rs", "CachedFile::lock", cf_id(), N(sync, "Mutex::lock_nth")),
        N(C + "error.rs", "answer(EFBIG) (argument of ok_or, built eagerly)"),
        plan,
        N(C + "cache/nbw.rs", "Plan::is_new, Plan::loc (count of unmapped pages)"),
        N(C + "engine/space.rs", "Engine::reserve(0) -> Ok"),
        N(C + "lowerfs.rs", "Lower::now"),
        N(C + "cache/nbw.rs", "Engine::patch_tx",
          N(C + "cache/patchframe.rs", "PatchFrames::begin"),
          closure,
          N(C + "cache/nbw.rs", "Engine::settle_patches",
            N(C + "cache/patchframe.rs", "PatchFrames::settle"))),
        N(C + "engine/space.rs", "Space::add(0)"),
        mirror)
    write_once = N(C + "ops/io.rs", "write_retrying::{closure} -> Engine::write_once",
        N(C + "engine/mod.rs", "Engine::handle",
          N(C + "handles.rs", "HandleTable::get", N(sync, "RwLock::read"))),
        N(C + "engine/mod.rs", "Engine::via -> Via::Cache"),
        N(C + "engine/mod.rs", "Engine::obj, Engine::inode",
          N(C + "inodes.rs", "InodeTable::get", N(sync, "RwLock::read")),
          N(C + "inodes.rs", "Inode::node", N(sync, "RwLock::read"))),
        N(C + "cache/mod.rs", "PageCache::config"),
        cache_entry,
        cached_write,
        N(C + "stats.rs", "Counters::add(app_bytes_written)"))
    return N("fuse/src/handlers.rs", "FuseFs::write",
        N(C + "ops/io.rs", "Engine::write",
          N(C + "ops/io.rs", "Engine::write_retrying",
            N(C + "engine/optx.rs", "Engine::attempt",
              N(C + "engine/optx.rs", "OpTx::new"),
              write_once,
              N(C + "engine/optx.rs", "OpTx::end (nothing running)"),
              N(C + "journal/checkpoint.rs", "Engine::checkpoint_if_full",
                N(C + "journal/mod.rs", "Journal::full", N(sync, "Mutex::lock (pending)")))),
            N(C + "cache/writeback.rs", "Engine::after_cached_write (background on)",
              N(C + "cache/writeback.rs", "Engine::cache_frames (below the high watermark)",
                N(C + "slots.rs", "SlotList::frames")))),
          N(C + "stats.rs", "Counters::request")),
        N(C + "cache/nbw.rs", "Engine::after_write_answered (async-bg: nothing)"))

# ---------- HEAD ----------
def new(first_write=False):
    C = "core/src/"
    sync = C + "base/sync.rs"
    SM = "txn/src/slots.rs"
    def cf_id():
        return N(C + "cache/state.rs", "CachedFile::id", N(C + "base/slots.rs", "Place::owner"))
    if not first_write:
        cache_entry = N(C + "cache/ops.rs", "PageCache::cache_entry",
                        N(C + "cache/mod.rs", "PageCache::get", N(sync, "Mutex::lock")))
        extents = N(C + "cache/ops.rs", "PageCache::extents (FIEMAP cached in the state)")
    else:
        cache_entry = N(C + "cache/ops.rs", "PageCache::cache_entry",
            N(C + "cache/mod.rs", "PageCache::get", N(sync, "Mutex::lock")),
            N(C + "cache/mod.rs", "PageCache::stripe", N(sync, "Mutex::lock")),
            N(C + "cache/mod.rs", "PageCache::get", N(sync, "Mutex::lock")),
            N(C + "base/lowerfs.rs", "Lower::getattr", N(sync, "assert_may_block")),
            N(C + "base/lowerfs.rs", "Lower::file_handle", N(sync, "assert_may_block")),
            N(C + "base/slots.rs", "SlotList::lock, RecordSlots::reserve", N(sync, "Mutex::lock"),
              N(SM, "SlotMap::lowest_roomy, bits, take")),
            N(C + "base/optx.rs", "OpTx::tx", N(sync, "Held::token"), T_begin()),
            N(C + "cache/record.rs", "Record::encode"),
            N(C + "base/slots.rs", "put_new, Place::offset", *T_update()),
            N(C + "base/optx.rs", "OpTx::end", T_commit()),
            N(C + "base/slots.rs", "SlotList::lock, RecordSlots::settle_new", N(sync, "Mutex::lock")),
            N(C + "cache/mod.rs", "PageCache::new_file",
              N(C + "cache/state.rs", "CachedFile::new", N(sync, "Mutex::new"))),
            N(C + "cache/mod.rs", "PageCache::insert", N(sync, "Mutex::lock"), cf_id(),
              N(C + "cache/counters.rs", "inc")))
        extents = N(C + "cache/ops.rs", "PageCache::extents",
            N(C + "cache/ops.rs", "PageCache::cache_io"),
            N(C + "base/lowerfs.rs", "Lower::open", N(sync, "assert_may_block")),
            N(C + "cache/state.rs", "CachedFile::may_hold"),
            N(C + "base/lowerfs.rs", "Lower::fiemap", N(sync, "assert_may_block")))
    plan = N(C + "cache/nbw.rs", "PageCache::plan_write",
        N(C + "base/pages.rs", "pieces (+ first next)"),
        extents,
        cf_id(),
        N(C + "cache/mod.rs", "PageCache::tables", N(sync, "Mutex::lock")),
        N(C + "cache/state.rs", "locate", N(C + "cache/policy/zones.rs", "ZoneTable::contains, zone_of")),
        N(C + "cache/patch.rs", "Patch::new, Patch::merge (apply, pieces, to_u16), Patch::slots"),
        N(C + "cache/nbw.rs", "PageCache::patch_room (under the patch limit)"),
        N(C + "base/pages.rs", "pieces: next -> None"))
    put = N(C + "cache/patchframe.rs", "PatchFrames::put, place, best_fit",
            N(SM, "SlotMap::best_fit -> None (no room: fresh patch frame)"),
            T_alloc(), *T_fresh_write(),
            N(SM, "SlotMap::bits, Run::mask (run_mask)"),
            N(C + "cache/patchframe.rs", "change_used", N(SM, "SlotMap::bits"),
              N(C + "cache/patchframe.rs", "set_used", N(SM, "SlotMap::set"))),
            N(C + "cache/patchframe.rs", "change_at"))
    closure = N(C + "cache/ops.rs", "cached_write::{closure} (phase 2)",
        N(C + "base/optx.rs", "OpTx::tx", N(sync, "Held::token"), T_begin()),
        N(C + "base/pages.rs", "pieces (no whole dirty page to store into)"),
        cf_id(),
        N(C + "cache/nbw.rs", "PageCache::write_plans",
          N(C + "cache/patch.rs", "Patch::encode (slots, run_sum)"),
          put),
        N(C + "cache/record.rs", "Record::encode"),
        N(C + "base/slots.rs", "put, Place::offset", *T_update()),
        N(C + "base/optx.rs", "OpTx::end (commit)", T_commit()))
    mirror = N(C + "cache/ops.rs", "PageCache::mirror_write",
        N(C + "cache/mod.rs", "PageCache::tick"),
        N(C + "cache/mod.rs", "PageCache::tables", N(sync, "Mutex::lock")),
        N(C + "cache/nbw.rs", "Plan::page, is_new, loc, loc"),
        N(C + "cache/policy/zones.rs", "ZoneTable::contains"),
        N(C + "cache/nbw.rs", "Plan::loc"),
        cf_id(),
        N(C + "cache/state.rs", "add_page",
          N(C + "cache/policy/zones.rs", "all.add_to_zone (zone_of, present_in, prev, next)"),
          N(C + "cache/counters.rs", "inc(pages_dirty)"),
          N(C + "cache/policy/zones.rs", "inactive.add_to_zone"),
          N(C + "cache/counters.rs", "inc(pages_inactive_dirty)")),
        N(C + "cache/counters.rs", "inc(patches_created), NbwCounters::patch_added"),
        cf_id(),
        N(C + "cache/nbw.rs", "PageCache::queue_fetches",
          N(sync, "Mutex::lock (fetches)"),
          N(C + "cache/fetchqueue.rs", "FetchQueue::len, push, len"),
          N(sync, "Bell::ring (fetcher_bell)")))
    cached_write = N(C + "cache/ops.rs", "PageCache::cached_write",
        N(C + "cache/state.rs", "CachedFile::lock", cf_id(), N(sync, "Mutex::lock_nth")),
        N(C + "base/pages.rs", "write_end"),
        plan,
        N(C + "cache/nbw.rs", "Plan::is_new, Plan::loc (count of unmapped pages)"),
        N(C + "base/mod.rs", "Base::reserve(0) -> Ok"),
        N(C + "base/lowerfs.rs", "Lower::now"),
        N(C + "base/pages.rs", "DataRecord::written",
          N(C + "cache/record.rs", "Record::size_mut, Record::modified")),
        N(C + "cache/nbw.rs", "PageCache::patch_tx",
          N(C + "cache/patchframe.rs", "PatchFrames::begin", N(SM, "SlotMap::len")),
          closure,
          N(C + "cache/nbw.rs", "PageCache::settle_patches",
            N(C + "cache/patchframe.rs", "PatchFrames::settle", N(SM, "SlotMap::len")))),
        N(C + "base/space.rs", "Space::add(0)"),
        mirror)
        # debug builds only: debug_check!(st.check(cf.id())) -- not in a release build
    write_once = N(C + "engine/ops/io.rs", "write_retrying::{closure} -> Engine::write_once",
        N(C + "engine/mod.rs", "Engine::handle",
          N(C + "base/handles.rs", "HandleTable::get", N(sync, "RwLock::read"))),
        N(C + "engine/mod.rs", "Engine::via -> Via::Cache"),
        N(C + "engine/mod.rs", "Engine::obj, Engine::inode",
          N(C + "base/inodes.rs", "InodeTable::get", N(sync, "RwLock::read")),
          N(C + "base/inodes.rs", "Inode::node", N(sync, "RwLock::read"))),
        N(C + "cache/mod.rs", "PageCache::config"),
        cache_entry,
        cached_write,
        N(C + "base/counters.rs", "Counters::add(app_bytes_written)"))
    return N("fuse/src/handlers.rs", "FuseFs::write",
        N(C + "engine/ops/io.rs", "Engine::write",
          N(C + "engine/ops/io.rs", "Engine::write_retrying",
            N(C + "engine/mod.rs", "Engine::attempt",
              N(C + "base/optx.rs", "OpTx::new"),
              write_once,
              N(C + "base/optx.rs", "OpTx::end (nothing running)"),
              N(C + "journal/checkpoint.rs", "Journal::checkpoint_if_full",
                N(C + "journal/mod.rs", "Journal::full", N(sync, "Mutex::lock (pending)"),
                  N(SM, "SlotMap::len")))),
            N(C + "cache/writeback.rs", "PageCache::after_cached_write (background on)",
              N(C + "cache/writeback.rs", "PageCache::cache_frames (below the high watermark)",
                N(C + "base/slots.rs", "SlotList::frames")))),
          N(C + "base/counters.rs", "Counters::request")),
        N(C + "engine/background.rs", "Engine::after_write_answered",
          N(C + "cache/nbw.rs", "PageCache::after_write_answered (async-bg: nothing)")))

LEAF = {"core/src/sync.rs", "core/src/base/sync.rs", "core/src/cache/counters.rs",
        "core/src/stats.rs", "core/src/base/counters.rs"}

def room(f):
    if f.startswith("fuse/"): return "fuse/"
    if f.startswith("txn/"): return "txn/"
    rest = f[len("core/src/"):]
    return rest.split("/")[0] + "/" if "/" in rest else rest

def exact_dir(f):
    return f.rsplit("/", 1)[0] + "/"

def keep(scope):
    def k(f):
        if scope == "all": return True
        if f.startswith("txn/"): return False
        if scope == "noleaf" and f in LEAF: return False
        return True
    return k

def entries(t, k, out):
    f, fn, kids = t
    if k(f): out.append((f, fn))
    for c in kids: entries(c, k, out)
    return out

def pc(t, k, out):
    """program-counter trace: a node's file again after each child returns"""
    f, fn, kids = t
    if k(f): out.append(f)
    for c in kids:
        pc(c, k, out)
        if k(f): out.append(f)
    return out

def collapse(seq):
    out = []
    for x in seq:
        if not out or out[-1] != x: out.append(x)
    return out

def metrics(t, scope):
    k = keep(scope)
    ent = entries(t, k, [])
    files = [f for f, _ in ent]
    cf = collapse(files)
    rooms = collapse([room(f) for f in files])
    pcr = collapse([room(f) for f in pc(t, k, [])])
    pcf = collapse(pc(t, k, []))
    def engine_segments(rs):
        return sum(1 for r in rs if r == "engine/")
    up = {}
    def edges(t):
        f, fn, kids = t
        for c in kids:
            if k(c[0]) and k(f) and room(c[0]) == "engine/" and room(f) not in ("engine/",):
                up.setdefault(room(f), []).append(c[0] + " " + c[1])
            edges(c)
    edges(t)
    core_files = sorted(set(x for x in files if x.startswith("core/")))
    sub = [x for x in core_files if "/" in x[len("core/src/"):]]
    return dict(
        calls_into_engine_by_caller_room=up,
        n_core_files=len(core_files),
        n_core_rooms=len(set(room(x) for x in core_files)),
        n_core_subdirs=len(set(exact_dir(x) for x in sub)),
        n_core_files_in_subdirs=len(sub),
        calls=len(ent),
        files_distinct=sorted(set(files)),
        n_files=len(set(files)),
        rooms_distinct=sorted(set(room(f) for f in files)),
        n_rooms=len(set(room(f) for f in files)),
        n_dirs=len(set(exact_dir(f) for f in files)),
        dirs=sorted(set(exact_dir(f) for f in files)),
        file_seq_len=len(cf),
        room_seq=rooms, room_transitions=len(rooms) - 1,
        engine_segments=engine_segments(rooms),
        pc_room_seq=pcr, pc_room_transitions=len(pcr) - 1,
        pc_engine_segments=engine_segments(pcr),
        pc_file_seq_len=len(pcf),
    )

def collapsed_entries(t, k):
    ent = entries(t, k, [])
    out = []
    for f, fn in ent:
        if out and out[-1][0] == f:
            out[-1][1].append(fn)
        else:
            out.append([f, [fn]])
    return out

if __name__ == "__main__":
    res = {}
    for rev, fn in (("d87a06a", old), ("HEAD", new)):
        for fw in (False, True):
            t = fn(fw)
            for scope in ("core+fuse", "noleaf", "all"):
                res[f"{rev}|{'first' if fw else 'steady'}|{scope}"] = metrics(t, scope)
            res[f"{rev}|{'first' if fw else 'steady'}|seq"] = collapsed_entries(t, keep("core+fuse"))
            res[f"{rev}|{'first' if fw else 'steady'}|seq_all"] = collapsed_entries(t, keep("all"))
    json.dump(res, open("write-path-trace.json", "w"), indent=1)
    for key, m in res.items():
        if key.endswith("seq") or key.endswith("seq_all"): continue
        print(key, "calls", m["calls"], "files", m["n_files"], "rooms", m["n_rooms"], "dirs", m["n_dirs"],
              "fileseq", m["file_seq_len"], "room_tr", m["room_transitions"], "eng_seg", m["engine_segments"],
              "| pc room_tr", m["pc_room_transitions"], "pc eng", m["pc_engine_segments"], "pc fileseq", m["pc_file_seq_len"])
        print("   rooms:", " -> ".join(m["room_seq"]))
