#!/usr/bin/env python3
"""Source metrics of the nvstack workspace at one git revision (pure source analysis, no build).

Usage:
    python3 bench/results/rooms/code-metrics.py [measure] REV [--repo .] [--out DIR/NAME]
        -> writes NAME.json and NAME.md (NAME defaults to the short form of REV)
    python3 bench/results/rooms/code-metrics.py compare BEFORE.json AFTER.json [--out compare.md]
        -> side-by-side markdown tables of two measurements

The files are read with `git ls-tree` / `git cat-file` straight from the object database: no
checkout, nothing written into the repository.

Metrics
 1. import graph of crates/core/src (files as nodes), Tarjan SCCs of more than one file; the
    path scanner mirrors crates/core/tests/rooms.rs (graph()), plus `mod x;` declarations, and
    is reported with and without a parent mod.rs's (or lib.rs's) edges to its own children;
    a cross-check with a real lexer (strings and block comments blanked too) is reported.
 2. files and lines per mechanism folder (top-level folder or top-level file) of core/src.
 3. largest files per crate (crates/*/src, top 8) and largest functions of core and device
    (top 10; `fn` items with brace-matched bodies on the lexed text - a heuristic).
 4. asserts per 1,000 non-blank non-comment lines of non-test code, per crate.
 5. `pub fn` / `pub(crate) fn` (and the other visibilities) per crate, non-test code.
"""

import argparse
import json
import os
import re
import subprocess
import sys
from collections import defaultdict, deque

CORE_SRC = "crates/core/src/"

# ---------------------------------------------------------------------------------------------
# git access


def git(repo, *args, binary=False):
    out = subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True).stdout
    return out if binary else out.decode()


def read_tree(repo, rev):
    """All .rs files under crates/ at `rev`: {path: text}."""
    names = [p for p in git(repo, "ls-tree", "-r", "--name-only", rev, "--", "crates").split("\n")
             if p.endswith(".rs")]
    proc = subprocess.Popen(["git", "-C", repo, "cat-file", "--batch"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    inp = "".join(f"{rev}:{n}\n" for n in names).encode()
    data, _ = proc.communicate(inp)
    files, pos = {}, 0
    for n in names:
        nl = data.index(b"\n", pos)
        header = data[pos:nl].split()
        size = int(header[2])
        body = data[nl + 1:nl + 1 + size]
        pos = nl + 1 + size + 1
        files[n] = body.decode("utf-8", errors="replace")
    return files


# ---------------------------------------------------------------------------------------------
# a small Rust lexer: comments blanked, string/char literal contents blanked (newlines kept)

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_ident_char(c):
    return c.isascii() and (c.isalnum() or c == "_")


def lex(src):
    """Returns (nocomment, clean): both of the same length as src with newlines in place.
    nocomment: comments replaced by spaces; clean: also the contents of string and char
    literals replaced by spaces (the quotes kept)."""
    n = len(src)
    nc = list(src)
    cl = list(src)

    def blank(a, b, both=True):
        for k in range(a, b):
            if src[k] != "\n":
                cl[k] = " "
                if both:
                    nc[k] = " "

    i = 0
    while i < n:
        c = src[i]
        if c == "/" and i + 1 < n and src[i + 1] == "/":
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif c == "/" and i + 1 < n and src[i + 1] == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            blank(i + 1, min(j, n), both=False)
            i = j + 1
        elif c == "'":
            if i + 1 < n and src[i + 1] == "\\":
                j = src.find("'", i + 3)
                j = n if j < 0 else j
                blank(i + 1, j, both=False)
                i = j + 1
            elif i + 2 < n and src[i + 2] == "'" and src[i + 1] != "\n":
                blank(i + 1, i + 2, both=False)
                i += 3
            else:
                i += 1  # a lifetime or label
        elif is_ident_char(c):
            m = IDENT.match(src, i)
            if not m:  # a number
                j = i
                while j < n and is_ident_char(src[j]):
                    j += 1
                i = j
                continue
            word = m.group()
            j = m.end()
            if word in ("r", "br", "cr") and j < n and src[j] in '#"':
                k = j
                while k < n and src[k] == "#":
                    k += 1
                if k < n and src[k] == '"':
                    hashes = k - j
                    close = '"' + "#" * hashes
                    e = src.find(close, k + 1)
                    e = n if e < 0 else e
                    blank(k + 1, e, both=False)
                    i = e + len(close)
                    continue
                i = j  # a raw identifier r#name
                continue
            if word in ("b", "c") and j < n and src[j] in "\"'":
                i = j  # the literal is lexed next
                continue
            i = j
        else:
            i += 1
    return "".join(nc), "".join(cl)


def match_close(text, open_pos, o="{", c="}"):
    depth = 0
    for k in range(open_pos, len(text)):
        ch = text[k]
        if ch == o:
            depth += 1
        elif ch == c:
            depth -= 1
            if depth == 0:
                return k
    return len(text) - 1


def line_starts(text):
    starts = [0]
    for m in re.finditer("\n", text):
        starts.append(m.end())
    return starts


def line_of(starts, pos):
    lo, hi = 0, len(starts) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts[mid] <= pos:
            lo = mid
        else:
            hi = mid - 1
    return lo + 1


# ---------------------------------------------------------------------------------------------
# test regions: items under #[cfg(test)] / #[cfg(all(test, ..))], on the clean text

def split_top(s):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def requires_test(pred):
    pred = re.sub(r"\s+", "", pred)
    if pred == "test":
        return True
    if pred.startswith("all(") and pred.endswith(")"):
        return any(requires_test(p) for p in split_top(pred[4:-1]))
    return False


ATTR = re.compile(r"#\s*(!?)\s*\[")


def attr_end(text, pos):
    """pos at '#': index just after the attribute's closing ']'."""
    b = text.index("[", pos)
    return match_close(text, b, "[", "]") + 1


def item_end(text, p):
    """End (exclusive) of the item/field/statement starting at p (attributes already skipped)."""
    depth = 0
    n = len(text)
    k = p
    while k < n:
        ch = text[k]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth < 0:
                return k
        elif ch == "{" and depth == 0:
            e = match_close(text, k) + 1
            m = re.match(r"[ \t]*[;,]", text[e:e + 40])
            return e + (m.end() if m else 0)
        elif ch == "}" and depth == 0:
            return k
        elif ch in ";," and depth == 0:
            return k + 1
        k += 1
    return n


def test_regions(clean):
    """[(start, end)] of test-only code; (0, len) if the file has an inner #![cfg(test)]."""
    regions = []
    for m in ATTR.finditer(clean):
        start = m.start()
        if any(a <= start < b for a, b in regions):
            continue
        end = attr_end(clean, start)
        body = clean[clean.index("[", start) + 1:end - 1].strip()
        cm = re.fullmatch(r"cfg\s*\((.*)\)", body, re.S)
        if not cm or not requires_test(cm.group(1)):
            continue
        if m.group(1) == "!":
            return [(0, len(clean))]
        p = end
        while True:  # further attributes of the same item
            ws = re.match(r"\s*", clean[p:])
            q = p + ws.end()
            if q < len(clean) and clean[q] == "#":
                p = attr_end(clean, q)
            else:
                p = q
                break
        regions.append((start, item_end(clean, p)))
    return regions


def in_regions(regions, pos):
    return any(a <= pos < b for a, b in regions)


# ---------------------------------------------------------------------------------------------
# per-file facts


class FileInfo:
    def __init__(self, path, src):
        self.path = path
        self.src = src
        self.nocomment, self.clean = lex(src)
        self.regions = test_regions(self.clean)
        self.starts = line_starts(src)
        self.total_lines = len(src.splitlines())
        self.test_file = False  # set from the module tree
        # code lines: lines with a non-blank char outside comments; test if its first such
        # char lies in a test region
        self.code_line_nos, self.test_line_nos = [], []
        for no, line in enumerate(self.nocomment.split("\n"), start=1):
            s = line.strip()
            if not s:
                continue
            first = self.starts[no - 1] + (len(line) - len(line.lstrip()))
            (self.test_line_nos if in_regions(self.regions, first) else self.code_line_nos).append(no)

    @property
    def code_lines(self):
        return len(self.code_line_nos) + len(self.test_line_nos)

    @property
    def nontest_code_lines(self):
        return 0 if self.test_file else len(self.code_line_nos)

    def is_test_pos(self, pos):
        return self.test_file or in_regions(self.regions, pos)


def crate_of(path):
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "crates" else None


def in_src(path):
    parts = path.split("/")
    return len(parts) > 3 and parts[2] == "src"


MOD_DECL = re.compile(r"(?<![A-Za-z0-9_])mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;")


def child_candidates(path, name):
    """Where `mod name;` in `path` looks for its file: next to a mod.rs/lib.rs/main.rs, else
    in the folder named after the file (`a/b.rs` -> `a/b/name.rs`, also for src/bin/x.rs)."""
    d, base = os.path.split(path)
    root = d if base in ("mod.rs", "lib.rs", "main.rs") else os.path.join(d, base[:-3])
    return [f"{root}/{name}.rs", f"{root}/{name}/mod.rs"]


def module_tree(infos, crate):
    """Marks test-only files (reached from the crate roots only through a `mod x;` declared
    under #[cfg(test)]) and returns the src files not reached from a root at all (lib.rs,
    main.rs, bin/*.rs)."""
    src_files = {p: fi for p, fi in infos.items() if crate_of(p) == crate and in_src(p)}
    children = defaultdict(list)  # path -> [(child path, declared under cfg(test))]
    for p, fi in src_files.items():
        for m in MOD_DECL.finditer(fi.clean):
            for cand in child_candidates(p, m.group(1)):
                if cand in src_files:
                    children[p].append((cand, in_regions(fi.regions, m.start())))
                    break
    roots = [p for p in src_files if re.fullmatch(rf"crates/{crate}/src/(lib|main)\.rs", p)
             or re.fullmatch(rf"crates/{crate}/src/bin/[^/]+\.rs", p)]

    def reach(through_test):
        seen, stack = set(), list(roots)
        while stack:
            p = stack.pop()
            if p not in seen:
                seen.add(p)
                stack += [c for c, t in children[p] if through_test or not t]
        return seen

    reached, nontest = reach(True), reach(False)
    for p in reached - nontest:
        src_files[p].test_file = True
    return sorted(set(src_files) - reached)


# ---------------------------------------------------------------------------------------------
# metric 1: the import graph of crates/core/src, as crates/core/tests/rooms.rs reads it


def module_of(rel):
    parts = rel[:-3].split("/") if rel.endswith(".rs") else rel.split("/")
    if parts and parts[-1] in ("mod", "lib"):
        parts.pop()
    return tuple(parts)


def rooms_code(src):
    """rooms.rs code(): each line cut at its first `//`; `#[cfg(test)]` modules removed
    (here blanked, newlines kept, so that line numbers stay; the scan is the same)."""
    lines = src.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    out = "".join((l[:l.find("//")] if "//" in l else l) + "\n" for l in lines)
    tag = "#[cfg(test)]"

    def blanked(s):
        return re.sub(r"[^\n]", " ", s)

    while True:
        at = out.find(tag)
        if at < 0:
            break
        rest = out[at:]
        open_ = rest.find("{")
        if open_ < 0:
            break
        if "mod " not in rest[:open_]:
            out = out[:at] + " " * len(tag) + out[at + len(tag):]
            continue
        depth, end = 0, len(rest)
        for i in range(open_, len(rest)):
            ch = rest[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    end = i + 1
                    break
        out = out[:at] + blanked(out[at:at + end]) + out[at + end:]
    return out


def ident_len(s, pos=0):
    k = pos
    while k < len(s) and is_ident_char(s[k]):
        k += 1
    return k - pos


def paths(prefix, text, out):
    """rooms.rs paths(): the module paths a path text names."""
    segs = list(prefix)
    rest = text
    while True:
        n = ident_len(rest)
        if n == 0:
            break
        segs.append(rest[:n])
        rest = rest[n:]
        if rest.startswith("::"):
            rest = rest[2:]
        else:
            out.append(segs)
            return
    if not rest.startswith("{"):
        out.append(segs)
        return
    inner = rest[1:]
    depth, start = 0, 0
    for i, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}" and depth == 0:
            item = inner[start:i].strip()
            if item:
                if item == "self":
                    out.append(list(segs))
                else:
                    paths(segs, item, out)
            return
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            item = inner[start:i].strip()
            if item == "self":
                out.append(list(segs))
            elif item:
                paths(segs, item, out)
            start = i + 1


def path_text_at(text, pos):
    """The text a path scan may need from pos: up to the end of a `{...}` group if the path
    reaches one (rooms.rs reads the whole rest; this bounds it with the same outcome)."""
    k = pos
    n = len(text)
    while True:
        m = ident_len(text, k)
        if m == 0:
            break
        k += m
        if text.startswith("::", k):
            k += 2
        else:
            return text[pos:k]
    if k < n and text[k] == "{":
        e = match_close(text, k)
        return text[pos:e + 1]
    return text[pos:k]


def core_graph(infos, variant):
    """{file: {target: (line, snippet)}} over crates/core/src. variant 'rooms' reads the text as
    rooms.rs does; 'lexed' blanks strings, block comments and every test-only item first."""
    files = {p[len(CORE_SRC):]: fi for p, fi in infos.items() if p.startswith(CORE_SRC)}
    modules = {module_of(rel): rel for rel in files}

    def resolve(segs):
        for n in range(len(segs), -1, -1):
            t = modules.get(tuple(segs[:n]))
            if t is not None:
                return t
        return None

    edges, mod_edges = {}, {}
    for me, fi in sorted(files.items()):
        module = module_of(me)
        if variant == "rooms":
            text = rooms_code(fi.src)
        else:
            t = list(fi.clean)
            for a, b in fi.regions:
                for k in range(a, b):
                    if t[k] != "\n":
                        t[k] = " "
            text = "".join(t)
        starts = line_starts(text)
        src_lines = fi.src.split("\n")
        used = {}
        inline = []  # (open, close, name) of inline `mod name { .. }` blocks (lexed reading)
        if variant == "lexed":
            for im in re.finditer(r"(?<![A-Za-z0-9_])mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*\{", text):
                o = im.end() - 1
                inline.append((o, match_close(text, o), im.group(1)))

        def module_at(pos):
            return module + tuple(nm for o, c, nm in inline if o < pos < c)

        def note(target, pos):
            if target != me and target not in used:
                ln = line_of(starts, pos)
                used[target] = (ln, src_lines[ln - 1].strip()[:140])

        for m in re.finditer("::", text):
            at = m.start()
            ws = at
            while ws > 0 and is_ident_char(text[ws - 1]):
                ws -= 1
            word = text[ws:at]
            preceded = text[:ws].endswith("::")
            module = module_at(at) if inline else module_of(me)
            if word == "crate":
                base = []
            elif word == "self":
                base = list(module)
            elif word == "super":
                base = list(module[:-1]) if module else []
            elif word and module + (word,) in modules:
                if preceded:
                    continue
                note(modules[module + (word,)], ws)
                base = list(module) + [word]
            else:
                continue
            if preceded:
                continue
            pos = at + 2
            while text.startswith("super::", pos):
                if base:
                    base.pop()
                pos += len("super::")
            named = []
            paths(base, path_text_at(text, pos), named)
            for segs in named:
                t = resolve(segs)
                if t is not None:
                    note(t, ws)
        # `mod x;` declarations: parent -> child
        module = module_of(me)
        decl = {}
        for m in MOD_DECL.finditer(text):
            t = modules.get(module + (m.group(1),))
            if t is not None and t != me:
                ln = line_of(starts, m.start())
                decl[t] = (ln, src_lines[ln - 1].strip()[:140])
        edges[me] = used
        mod_edges[me] = decl
    return edges, mod_edges


def is_child(parent, child):
    """rooms.rs is_child()."""
    def d(f):
        return f.rsplit("/", 1)[0] if "/" in f else ""
    if not (parent.endswith("mod.rs") or parent == "lib.rs") or parent == child:
        return False
    pd, cd = d(parent), d(child)
    return cd == pd or (child.endswith("/mod.rs") and d(cd) == pd)


def tarjan(nodes, succ):
    index, low, on, stack, sccs = {}, {}, set(), [], []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(succ.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            sccs.append(sorted(comp))

    for v in sorted(nodes):
        if v not in index:
            strong(v)
    return sccs


def shortest_cycle(comp, succ):
    """A shortest cycle through the component's first file (BFS)."""
    cs = set(comp)
    best = None
    for s in comp:
        prev = {s: None}
        q = deque([s])
        found = None
        while q and not found:
            v = q.popleft()
            for w in sorted(succ.get(v, ())):
                if w not in cs:
                    continue
                if w == s:
                    found = v
                    break
                if w not in prev:
                    prev[w] = v
                    q.append(w)
        if found is None:
            continue
        path = [found]
        while prev[path[-1]] is not None:
            path.append(prev[path[-1]])
        path.reverse()
        cyc = path + [s]
        if best is None or len(cyc) < len(best):
            best = cyc
    return best


def graph_metric(infos):
    out = {}
    for variant in ("rooms", "lexed"):
        uses, decls = core_graph(infos, variant)
        full = {f: {**decls[f], **uses[f]} for f in uses}
        rule = {f: {t: e for t, e in full[f].items() if not is_child(f, t)} for f in full}
        res = {}
        for name, g in (("with_parent_child_edges", full), ("rule_without_parent_child_edges", rule)):
            succ = {f: set(ts) for f, ts in g.items()}
            sccs = [c for c in tarjan(g.keys(), succ) if len(c) > 1]
            comps = []
            for c in sorted(sccs, key=lambda c: (-len(c), c)):
                cs = set(c)
                comps.append({
                    "size": len(c),
                    "files": c,
                    "example_cycle": shortest_cycle(c, succ),
                    "edges": [{"from": f, "to": t, "line": g[f][t][0], "text": g[f][t][1]}
                              for f in c for t in sorted(g[f]) if t in cs],
                })
            res[name] = {"edges": sum(len(v) for v in g.values()), "sccs": comps}
        res["files"] = len(full)
        res["edge_list"] = {f: sorted(ts) for f, ts in full.items()}
        res["mod_decl_edges"] = sum(len(v) for v in decls.values())
        out[variant] = res
    a = {(f, t) for f, ts in out["rooms"]["edge_list"].items() for t in ts}
    b = {(f, t) for f, ts in out["lexed"]["edge_list"].items() for t in ts}
    out["cross_check"] = {"only_rooms_reading": sorted(map(list, a - b)),
                          "only_lexed_reading": sorted(map(list, b - a))}
    for v in ("rooms", "lexed"):
        del out[v]["edge_list"]
    uses, decls = core_graph(infos, "rooms")
    # rooms' order (crates/core/tests/rooms.rs, if the revision has it): uses against ORDER
    rooms_rs = infos.get("crates/core/tests/rooms.rs")
    om = rooms_rs and re.search(r"const ORDER:[^=]*=\s*\[([^\]]*)\]", rooms_rs.src)
    if om:
        order = re.findall(r'"([^"]+)"', om.group(1))
        room = lambda f: f.split("/")[0][:-3] if "/" not in f else f.split("/")[0]
        wrong = []
        for f, us in sorted(uses.items()):
            fr = room(f)
            if fr == "lib":
                continue
            if fr not in order:
                wrong.append(f"{f}: room {fr} is not in ORDER")
                continue
            for t in sorted(us):
                to = room(t)
                if to != fr and (to not in order or order.index(to) >= order.index(fr)):
                    wrong.append(f"{f} ({fr}) uses {t} ({to})")
        out["rooms_order"] = {"order": order, "violations": wrong}
    else:
        out["rooms_order"] = None
    out["edges"] = {f: [{"to": t, "parent_to_child": is_child(f, t), "mod_decl": t in decls[f]
                         and t not in uses[f], "line": e[0], "text": e[1]}
                        for t, e in sorted({**decls[f], **uses[f]}.items())] for f in uses}
    return out


# ---------------------------------------------------------------------------------------------
# metric 2: mechanism folders of core/src


def folders_metric(infos):
    groups = defaultdict(lambda: {"files": 0, "lines": 0, "code_lines": 0, "nontest_code_lines": 0})
    for p, fi in infos.items():
        if not p.startswith(CORE_SRC):
            continue
        rel = p[len(CORE_SRC):]
        key = rel.split("/")[0] + "/" if "/" in rel else rel
        g = groups[key]
        g["files"] += 1
        g["lines"] += fi.total_lines
        g["code_lines"] += fi.code_lines
        g["nontest_code_lines"] += fi.nontest_code_lines
    return dict(sorted(groups.items()))


# ---------------------------------------------------------------------------------------------
# metric 3: largest files and functions

FN = re.compile(r"(?<![A-Za-z0-9_])fn\s+(r#)?([A-Za-z_][A-Za-z0-9_]*)")
IMPL_TRAIT = re.compile(r"(?<![A-Za-z0-9_])(impl|trait|mod)(?![A-Za-z0-9_])")


def block_spans(clean):
    """[(start, end, label)] of impl, trait and inline mod blocks."""
    spans = []
    for m in IMPL_TRAIT.finditer(clean):
        kw = m.group(1)
        if kw == "impl":
            k = m.start() - 1
            while k >= 0 and clean[k] in " \t\n":
                k -= 1
            prev_word = re.search(r"([A-Za-z_]+)\s*$", clean[:m.start()])
            if not (k < 0 or clean[k] in "};{]" or (prev_word and prev_word.group(1) in
                                                      ("unsafe", "default"))):
                continue  # `impl Trait` in a type
        # header up to the first `{` or `;` outside () [] <>
        depth, k = 0, m.end()
        while k < len(clean):
            ch = clean[k]
            if ch in "([<":
                depth += 1
            elif ch in ")]>":
                if ch == ">" and clean[k - 1] == "-":
                    pass
                else:
                    depth -= 1
            elif ch in "{;" and depth <= 0:
                break
            k += 1
        if k >= len(clean) or clean[k] == ";":
            continue
        header = re.sub(r"\s+", " ", clean[m.start():k]).strip()
        end = match_close(clean, k)
        spans.append((k, end, header_label(kw, header)))
    return spans


def strip_generics(s):
    out, depth = "", 0
    for i, ch in enumerate(s):
        if ch == "<":
            depth += 1
        elif ch == ">" and not (i and s[i - 1] == "-"):
            depth -= 1
        elif depth == 0:
            out += ch
    return out


def header_label(kw, header):
    h = strip_generics(header)
    h = re.split(r"\bwhere\b", h)[0].strip()
    if kw == "mod":
        return re.sub(r"^.*\bmod\s+", "mod ", h)
    if kw == "trait":
        m = re.search(r"\btrait\s+([A-Za-z_0-9]+)", h)
        return f"trait {m.group(1)}" if m else h
    body = re.sub(r"^(unsafe\s+|default\s+)*impl\s*", "", h).strip()
    if " for " in f" {body} ":
        tr, ty = body.split(" for ", 1)
        return f"{ty.strip().split('::')[-1]} (impl {tr.strip().split('::')[-1]})"
    return body.split("::")[-1].strip()


def functions(fi):
    clean = fi.clean
    spans = block_spans(clean)
    fns = []
    for m in FN.finditer(clean):
        depth, k = 0, m.end()
        while k < len(clean):
            ch = clean[k]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif ch in "{;" and depth == 0:
                break
            k += 1
        if k >= len(clean) or clean[k] == ";":
            continue  # a declaration without a body
        end = match_close(clean, k)
        l0, l1 = line_of(fi.starts, m.start()), line_of(fi.starts, end)
        encl = [s for s in spans if s[0] < m.start() < s[1]]
        owner = max(encl, key=lambda s: s[0])[2] if encl else None
        name = m.group(2)
        fns.append({"name": name, "owner": owner, "line": l0, "end_line": l1,
                    "lines": l1 - l0 + 1, "test": fi.is_test_pos(m.start())})
    return fns


def largest_metric(infos):
    per_crate = defaultdict(list)
    for p, fi in infos.items():
        c = crate_of(p)
        if c and in_src(p):
            per_crate[c].append({"file": p, "lines": fi.total_lines, "code_lines": fi.code_lines,
                                 "nontest_code_lines": fi.nontest_code_lines,
                                 "test_file": fi.test_file})
    files = {c: sorted(v, key=lambda r: (-r["lines"], r["file"]))[:8]
             for c, v in sorted(per_crate.items())}
    funcs = {}
    for c in ("core", "device"):
        allf = []
        for p, fi in infos.items():
            if crate_of(p) == c and in_src(p):
                nc_lines = fi.nocomment.split("\n")
                for f in functions(fi):
                    f["file"] = p
                    f["code_lines"] = sum(1 for no in range(f["line"], f["end_line"] + 1)
                                          if nc_lines[no - 1].strip())
                    allf.append(f)
        key = lambda f: (-f["lines"], f["file"], f["line"])
        funcs[c] = {"nontest": sorted([f for f in allf if not f["test"]], key=key)[:10],
                    "including_tests": sorted(allf, key=key)[:10],
                    "count_nontest": sum(1 for f in allf if not f["test"]),
                    "count_all": len(allf)}
    return {"files": files, "functions": funcs}


# ---------------------------------------------------------------------------------------------
# metrics 4 and 5: asserts and visibility per crate

ASSERT = re.compile(r"(?<![A-Za-z0-9_])(debug_assert|assert)(_eq|_ne)?\s*!")
MACRO_RULES = re.compile(r"macro_rules!\s*([A-Za-z_][A-Za-z0-9_]*)")
FN_VIS = re.compile(
    r"(?<![A-Za-z0-9_])(?:(pub)\s*(\(\s*(?:crate|super|self|in\s+[^)]*)\s*\))?\s+)?"
    r"(?:(?:const|async|unsafe|safe)\s+|extern\s+(?:\"[^\"]*\"\s+)?)*fn\s+(?:r#)?[A-Za-z_]")


def assert_metric(infos, project_macros):
    macro_re = None
    if project_macros:
        macro_re = re.compile(r"(?<![A-Za-z0-9_])(" + "|".join(map(re.escape, project_macros))
                              + r")\s*!")
    crates = defaultdict(lambda: {"files": 0, "lines": 0, "asserts": 0, "by_macro": defaultdict(int),
                                  "files_without_assert": 0, "lines_in_files_without_assert": 0,
                                  "brief_literal": {"lines": 0, "asserts": 0},
                                  "pub_fn": 0, "pub_crate_fn": 0, "pub_super_or_in_fn": 0,
                                  "private_fn": 0})
    for p, fi in sorted(infos.items()):
        c = crate_of(p)
        if not c or not in_src(p):
            continue
        r = crates[c]
        # the brief's literal reading: only `#[cfg(test)] mod NAME {..}` blocks are dropped
        mod_regions = [(a, b) for a, b in fi.regions
                       if re.match(r"#\s*\[[^\]]*\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{",
                                   fi.clean[a:b])]
        bl_lines = 0
        for no, line in enumerate(fi.nocomment.split("\n"), start=1):
            if line.strip():
                first = fi.starts[no - 1] + len(line) - len(line.lstrip())
                if not in_regions(mod_regions, first):
                    bl_lines += 1
        bl_asserts = sum(1 for m in ASSERT.finditer(fi.clean) if not in_regions(mod_regions, m.start()))
        if macro_re:
            bl_asserts += sum(1 for m in macro_re.finditer(fi.clean)
                              if not in_regions(mod_regions, m.start()))
        r["brief_literal"]["lines"] += bl_lines
        r["brief_literal"]["asserts"] += bl_asserts
        if fi.test_file:
            continue
        n_assert = 0
        for m in ASSERT.finditer(fi.clean):
            if not fi.is_test_pos(m.start()):
                n_assert += 1
                r["by_macro"][m.group(1) + (m.group(2) or "") + "!"] += 1
        if macro_re:
            for m in macro_re.finditer(fi.clean):
                if not fi.is_test_pos(m.start()):
                    n_assert += 1
                    r["by_macro"][m.group(1) + "!"] += 1
        lines = fi.nontest_code_lines
        r["files"] += 1
        r["lines"] += lines
        r["asserts"] += n_assert
        if n_assert == 0:
            r["files_without_assert"] += 1
            r["lines_in_files_without_assert"] += lines
        for m in FN_VIS.finditer(fi.clean):
            if fi.is_test_pos(m.start()):
                continue
            if m.group(1) and not m.group(2):
                r["pub_fn"] += 1
            elif m.group(1) and re.sub(r"\s", "", m.group(2)) == "(crate)":
                r["pub_crate_fn"] += 1
            elif m.group(1):
                r["pub_super_or_in_fn"] += 1
            else:
                r["private_fn"] += 1
    out = {}
    for c, r in sorted(crates.items()):
        r["by_macro"] = dict(sorted(r["by_macro"].items()))
        r["asserts_per_kloc"] = round(1000 * r["asserts"] / r["lines"], 2) if r["lines"] else None
        r["share_of_lines_without_assert"] = (round(r["lines_in_files_without_assert"] / r["lines"], 3)
                                              if r["lines"] else None)
        bl = r["brief_literal"]
        bl["asserts_per_kloc"] = round(1000 * bl["asserts"] / bl["lines"], 2) if bl["lines"] else None
        out[c] = dict(r)
    return out


def core_engine_slice(infos):
    """Asserts per kLOC for core/src/engine/ alone (the issue's 'engine' may mean it)."""
    lines = asserts = 0
    for p, fi in infos.items():
        if p.startswith(CORE_SRC + "engine/") and not fi.test_file:
            lines += fi.nontest_code_lines
            asserts += sum(1 for m in ASSERT.finditer(fi.clean) if not fi.is_test_pos(m.start()))
    return {"files_under": "crates/core/src/engine/", "lines": lines, "asserts": asserts,
            "asserts_per_kloc": round(1000 * asserts / lines, 2) if lines else None}


# ---------------------------------------------------------------------------------------------
# driver


def measure(repo, rev):
    sha = git(repo, "rev-parse", rev).strip()
    raw = read_tree(repo, sha)
    infos = {p: FileInfo(p, s) for p, s in raw.items()}
    crates = sorted({crate_of(p) for p in infos if crate_of(p)})
    unreached = {}
    for c in crates:
        u = module_tree(infos, c)
        if u:
            unreached[c] = u
    macros = defaultdict(list)
    for p, fi in infos.items():
        for m in MACRO_RULES.finditer(fi.clean):
            macros[m.group(1)].append(p)
    project_macros = sorted(n for n in macros if "invariant" in n or "debug_check" in n)
    test_only = sorted(p for p, fi in infos.items() if fi.test_file)
    return {
        "revision": rev,
        "commit": sha,
        "subject": git(repo, "log", "-1", "--format=%s", sha).strip()[:200],
        "crates": crates,
        "macro_rules_found": {n: sorted(ps) for n, ps in sorted(macros.items())},
        "project_assert_macros": project_macros,
        "test_only_src_files": test_only,
        "src_files_outside_module_tree": unreached,
        "graph": graph_metric(infos),
        "folders": folders_metric(infos),
        "largest": largest_metric(infos),
        "asserts": assert_metric(infos, project_macros),
        "core_engine_folder_asserts": core_engine_slice(infos),
    }


# ---------------------------------------------------------------------------------------------
# markdown


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    return "\n".join(out)


def fmt_fn(f):
    owner = f"{f['owner']}::" if f["owner"] else ""
    return f"`{owner}{f['name']}`"


def render(m):
    md = [f"# nvstack source metrics at `{m['revision']}` ({m['commit'][:10]})", "",
          f"Commit subject: {m['subject']}", ""]
    g = m["graph"]
    md += ["## 1. Import graph of crates/core/src", "",
           f"{g['rooms']['files']} files. A use is any `crate::`, `self::`, `super::` or "
           "child-module path outside `//` comments and `#[cfg(test)]` modules, resolved to the "
           "deepest existing module file (`a/b.rs` or `a/b/mod.rs`, else `a.rs`/`a/mod.rs`, "
           "... else `lib.rs`), read as crates/core/tests/rooms.rs reads it; `mod x;` "
           "declarations add parent->child edges. The rule (rooms.rs) drops the edges of a "
           "`mod.rs` / `lib.rs` to its own children (files of its folder and the `mod.rs` of "
           "its direct subfolders).", ""]
    for variant, title in (("rooms", "rooms.rs reading"),
                           ("lexed", "cross-check: exact reading (strings, block comments and every test-only item blanked; `self::`/`super::` inside an inline `mod x { .. }` block taken relative to that block)")):
        v = g[variant]
        md += [f"### {title}", ""]
        for name, lab in (("rule_without_parent_child_edges", "without parent->child edges (the project's rule)"),
                          ("with_parent_child_edges", "with parent->child edges")):
            r = v[name]
            md.append(f"**{lab}**: {r['edges']} edges, {len(r['sccs'])} SCC(s) of more than one file"
                      + (":" if r["sccs"] else "."))
            md.append("")
            for i, c in enumerate(r["sccs"], 1):
                md.append(f"- SCC {i} ({c['size']} files): " + ", ".join(f"`{f}`" for f in c["files"]))
                if True:
                    md.append(f"  - a shortest cycle: {' -> '.join(c['example_cycle'])}")
                    if name == "rule_without_parent_child_edges":
                        md.append(f"  - {len(c['edges'])} edges inside it:")
                        for e in c["edges"]:
                            md.append(f"    - `{e['from']}` -> `{e['to']}` (line {e['line']}: `{e['text']}`)")
            md.append("")
    cc = g["cross_check"]
    ro = g.get("rooms_order")
    if ro:
        md += [f"Rooms' order from crates/core/tests/rooms.rs ({' < '.join(ro['order'])}): "
               f"{len(ro['violations'])} use(s) against it (rooms reading)" + (":" if ro["violations"] else "."), ""]
        md += [f"- {w}" for w in ro["violations"]] + ([""] if ro["violations"] else [])
    else:
        md += ["crates/core/tests/rooms.rs is not in this revision: no rooms' order to check.", ""]
    md += [f"Edges only in the rooms reading: {len(cc['only_rooms_reading'])}; only in the lexed "
           f"reading: {len(cc['only_lexed_reading'])}.", ""]
    for lab, lst in (("rooms only", cc["only_rooms_reading"]), ("lexed only", cc["only_lexed_reading"])):
        for a, b in lst[:30]:
            md.append(f"- {lab}: `{a}` -> `{b}`")
    md.append("")

    md += ["## 2. Files and lines per mechanism folder of crates/core/src", "",
           "lines = all lines; code = non-blank non-comment lines; non-test = code outside "
           "`#[cfg(test)]` items and test-only files.", ""]
    rows = [[k, v["files"], v["lines"], v["code_lines"], v["nontest_code_lines"]]
            for k, v in m["folders"].items()]
    tot = [sum(v[k] for v in m["folders"].values()) for k in ("files", "lines", "code_lines", "nontest_code_lines")]
    rows.append(["**total**", *tot])
    md += [table(["folder / file", "files", "lines", "code", "non-test code"], rows), ""]

    md += ["## 3. Largest files per crate (crates/*/src, top 8 by lines)", ""]
    for c, fs in m["largest"]["files"].items():
        md += [f"**{c}**", "", table(["file", "lines", "code", "non-test code"],
                                     [[f"`{r['file']}`" + (" (test-only)" if r["test_file"] else ""),
                                       r["lines"], r["code_lines"], r["nontest_code_lines"]] for r in fs]), ""]
    md += ["### Largest functions (top 10 by lines, `fn` line to closing brace)", "",
           "Heuristic: `fn NAME` on the lexed text (comments and literal contents blanked), "
           "body found by the first `{` outside `()`/`[]` and brace matching; owner = the "
           "innermost enclosing `impl`/`trait`/inline `mod` block. Nested fns are counted in "
           "their outer fn too.", ""]
    for c, d in m["largest"]["functions"].items():
        md += [f"**{c}** (non-test code; {d['count_nontest']} fns with bodies, {d['count_all']} incl. tests)", "",
               table(["fn", "file:line", "lines", "code"],
                     [[fmt_fn(f), f"`{f['file']}:{f['line']}`", f["lines"], f["code_lines"]]
                      for f in d["nontest"]]), ""]
        top_t = [f for f in d["including_tests"] if f["test"]]
        if top_t:
            md += [f"Test functions among the top 10 when tests are included: " +
                   ", ".join(f"{fmt_fn(f)} ({f['lines']})" for f in top_t), ""]

    md += ["## 4. Asserts per 1,000 lines (non-test code of crates/*/src)", "",
           "Counted: `assert!`, `assert_eq!`, `assert_ne!`, `debug_assert!`, `debug_assert_eq!`, "
           "`debug_assert_ne!` (on the lexed text: none in comments or strings) plus project "
           f"macros named `*invariant*`/`*debug_check*` (macro_rules! found: "
           f"{', '.join(m['project_assert_macros']) or 'none'}). Excluded: every item under "
           "`#[cfg(test)]` / `#[cfg(all(test, ..))]` (test modules, also test-only fns, fields, "
           "uses) and files declared by a `#[cfg(test)] mod x;` (and their children); tests/ "
           "and benches/ are outside src anyway. Lines = non-blank non-comment lines of the same "
           "code. `brief literal` drops only `#[cfg(test)] mod NAME { .. }` blocks (test-only "
           "files and fns counted).", ""]
    rows = []
    for c, r in m["asserts"].items():
        rows.append([c, r["files"], r["lines"], r["asserts"], r["asserts_per_kloc"],
                     r["files_without_assert"], r["lines_in_files_without_assert"],
                     f"{100 * r['share_of_lines_without_assert']:.0f}%" if r["lines"] else "-",
                     r["brief_literal"]["asserts_per_kloc"]])
    md += [table(["crate", "files", "lines", "asserts", "per kLOC", "files w/o assert",
                  "lines in files w/o assert", "share", "per kLOC (brief literal)"], rows), ""]
    e = m["core_engine_folder_asserts"]
    md += [f"crates/core/src/engine/ alone: {e['asserts']} asserts in {e['lines']} lines = "
           f"{e['asserts_per_kloc']} per kLOC.", ""]
    md += ["By macro: " + "; ".join(f"{c}: " + ", ".join(f"{k} {v}" for k, v in r["by_macro"].items())
                                    for c, r in m["asserts"].items()), ""]

    md += ["## 5. Function visibility per crate (non-test code of crates/*/src)", ""]
    md += [table(["crate", "pub fn", "pub(crate) fn", "pub(super)/pub(in ..) fn", "private fn"],
                 [[c, r["pub_fn"], r["pub_crate_fn"], r["pub_super_or_in_fn"], r["private_fn"]]
                  for c, r in m["asserts"].items()]), ""]
    md += ["Counted on `fn` items incl. declarations without body (trait methods); `pub` with "
           "`const`/`async`/`unsafe`/`extern` qualifiers counts as `pub fn`. Trait impl methods "
           "have no visibility keyword and count as private.", ""]
    md += ["## Notes", "",
           "- test-only src files: " + (", ".join(f"`{p}`" for p in m["test_only_src_files"]) or "none"),
           "- src files outside the module tree: " + (json.dumps(m["src_files_outside_module_tree"]) or "none"),
           ""]
    return "\n".join(md)


def render_compare(a, b):
    la, lb = a["revision"], b["revision"]
    md = [f"# nvstack source metrics: `{la}` ({a['commit'][:10]}) vs `{lb}` ({b['commit'][:10]})", ""]
    md += ["## 1. Import cycles in crates/core/src (SCCs of more than one file)", "",
           "rooms reading = the scan of crates/core/tests/rooms.rs; exact reading = strings, block "
           "comments and all test-only items blanked, `self::`/`super::` inside an inline "
           "`mod x { .. }` relative to that block.", ""]
    for variant, vlab in (("rooms", "rooms reading"), ("lexed", "exact reading")):
        for name, lab in (("rule_without_parent_child_edges", "without parent->child edges (the project's rule)"),
                          ("with_parent_child_edges", "with parent->child edges")):
            md += [f"**{vlab}, {lab}**", ""]
            rows = []
            for m in (a, b):
                r = m["graph"][variant][name]
                rows.append([f"`{m['revision']}`", m["graph"][variant]["files"], r["edges"], len(r["sccs"]),
                             "<br>".join(f"{c['size']} files: " + ", ".join(c["files"]) for c in r["sccs"]) or "none"])
            md += [table(["revision", "files", "edges", "SCCs", "SCCs (size: files)"], rows), ""]
    for m in (a, b):
        cc = m["graph"]["cross_check"]
        diff = [f"`{x}` -> `{y}` (rooms reading only)" for x, y in cc["only_rooms_reading"]] + \
               [f"`{x}` -> `{y}` (exact reading only)" for x, y in cc["only_lexed_reading"]]
        md.append(f"- `{m['revision']}`: edges the readings disagree on: " + ("; ".join(diff) or "none"))
        ro = m["graph"].get("rooms_order")
        md.append(f"- `{m['revision']}`: rooms' order check: " +
                  (f"{len(ro['violations'])} use(s) against {' < '.join(ro['order'])}" if ro else
                   "no crates/core/tests/rooms.rs at this revision"))
    md.append("")
    md += ["## 2. Mechanism folders of crates/core/src", ""]
    keys = sorted(set(a["folders"]) | set(b["folders"]))
    z = {"files": 0, "lines": 0, "code_lines": 0, "nontest_code_lines": 0}
    rows = []
    for k in keys:
        x, y = a["folders"].get(k, z), b["folders"].get(k, z)
        rows.append([k, x["files"], y["files"], x["lines"], y["lines"], x["nontest_code_lines"], y["nontest_code_lines"]])
    tot = lambda m, f: sum(v[f] for v in m["folders"].values())
    rows.append(["**total**", tot(a, "files"), tot(b, "files"), tot(a, "lines"), tot(b, "lines"),
                 tot(a, "nontest_code_lines"), tot(b, "nontest_code_lines")])
    md += [table(["folder / file", f"files {la}", f"files {lb}", f"lines {la}", f"lines {lb}",
                  f"non-test code {la}", f"non-test code {lb}"], rows), ""]
    md += ["## 3. Largest files per crate (top 8 by lines)", ""]
    for c in sorted(set(a["largest"]["files"]) | set(b["largest"]["files"])):
        fa, fb = a["largest"]["files"].get(c, []), b["largest"]["files"].get(c, [])
        rows = []
        for i in range(max(len(fa), len(fb))):
            x = fa[i] if i < len(fa) else None
            y = fb[i] if i < len(fb) else None
            rows.append([i + 1, f"`{x['file'][len('crates/'):]}`" if x else "", x["lines"] if x else "",
                         f"`{y['file'][len('crates/'):]}`" if y else "", y["lines"] if y else ""])
        md += [f"**{c}**", "", table(["#", la, "lines", lb, "lines"], rows), ""]
    md += ["## 3b. Largest non-test functions (top 10 by lines)", ""]
    for c in ("core", "device"):
        fa, fb = a["largest"]["functions"][c]["nontest"], b["largest"]["functions"][c]["nontest"]
        rows = []
        for i in range(max(len(fa), len(fb))):
            x = fa[i] if i < len(fa) else None
            y = fb[i] if i < len(fb) else None
            cell = lambda f: (f"{fmt_fn(f)} `{f['file'][len('crates/'):]}:{f['line']}`", f["lines"]) if f else ("", "")
            rows.append([i + 1, *cell(x), *cell(y)])
        md += [f"**{c}**", "", table(["#", la, "lines", lb, "lines"], rows), ""]
    md += ["## 4. Asserts per 1,000 non-blank non-comment lines of non-test code", ""]
    rows = []
    for c in sorted(set(a["asserts"]) | set(b["asserts"])):
        x, y = a["asserts"].get(c), b["asserts"].get(c)
        g = lambda r, k: r[k] if r else "-"
        sh = lambda r: f"{r['lines_in_files_without_assert']} ({100 * r['share_of_lines_without_assert']:.0f}%)" if r and r["lines"] else "-"
        rows.append([c, g(x, "lines"), g(y, "lines"), g(x, "asserts"), g(y, "asserts"),
                     g(x, "asserts_per_kloc"), g(y, "asserts_per_kloc"), sh(x), sh(y),
                     x["brief_literal"]["asserts_per_kloc"] if x else "-",
                     y["brief_literal"]["asserts_per_kloc"] if y else "-"])
    ea, eb = a["core_engine_folder_asserts"], b["core_engine_folder_asserts"]
    rows.append(["core/src/engine/ only", ea["lines"], eb["lines"], ea["asserts"], eb["asserts"],
                 ea["asserts_per_kloc"], eb["asserts_per_kloc"], "", "", "", ""])
    md += [table(["crate", f"lines {la}", f"lines {lb}", f"asserts {la}", f"asserts {lb}",
                  f"per kLOC {la}", f"per kLOC {lb}", f"lines in files w/o assert {la}",
                  f"lines in files w/o assert {lb}", f"per kLOC brief-literal {la}",
                  f"per kLOC brief-literal {lb}"], rows), ""]
    md += ["## 5. `pub fn` vs `pub(crate) fn` (non-test code)", ""]
    rows = []
    for c in sorted(set(a["asserts"]) | set(b["asserts"])):
        x, y = a["asserts"].get(c), b["asserts"].get(c)
        g = lambda r, k: r[k] if r else "-"
        rows.append([c, g(x, "pub_fn"), g(y, "pub_fn"), g(x, "pub_crate_fn"), g(y, "pub_crate_fn"),
                     g(x, "pub_super_or_in_fn"), g(y, "pub_super_or_in_fn"), g(x, "private_fn"), g(y, "private_fn")])
    md += [table(["crate", f"pub fn {la}", f"pub fn {lb}", f"pub(crate) fn {la}", f"pub(crate) fn {lb}",
                  f"pub(super/in) {la}", f"pub(super/in) {lb}", f"private {la}", f"private {lb}"], rows), ""]
    for m in (a, b):
        md.append(f"- `{m['revision']}` test-only src files (excluded from 4 and 5): " +
                  (", ".join(f"`{p}`" for p in m["test_only_src_files"]) or "none"))
    md += ["", "How each number is counted: see the per-revision markdown files.", ""]
    return "\n".join(md)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("rev")
    m.add_argument("--repo", default=".")
    m.add_argument("--out", help="output path without extension (NAME.json, NAME.md)")
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    c.add_argument("--out", default="compare.md")
    argv = sys.argv[1:]
    if argv and argv[0] not in ("measure", "compare", "-h", "--help"):
        argv = ["measure"] + argv  # `measure.py REV --out PATH` works too
    args = ap.parse_args(argv)
    if args.cmd == "measure":
        res = measure(args.repo, args.rev)
        out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       re.sub(r"[^A-Za-z0-9._-]", "_", args.rev))
        with open(out + ".json", "w") as f:
            json.dump(res, f, indent=1)
        with open(out + ".md", "w") as f:
            f.write(render(res))
        print(f"wrote {out}.json and {out}.md")
        g = res["graph"]["rooms"]["rule_without_parent_child_edges"]["sccs"]
        print(f"SCCs (rule): {[c['files'] for c in g] or 'none'}")
    else:
        a, b = (json.load(open(p)) for p in (args.before, args.after))
        with open(args.out, "w") as f:
            f.write(render_compare(a, b))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
