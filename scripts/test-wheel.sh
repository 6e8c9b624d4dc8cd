#!/usr/bin/env bash
# The wheel, as a user gets it: builds it (scripts/wheel.sh), checks its
# platform tag (auditwheel show) and every binary's glibc needs (objdump -T)
# against PyTorch's floor, manylinux_2_28, and its size (<= 10 MiB), installs
# it alone into a fresh venv, runs the README's main job (`threadwise tune -n 2`)
# from there with nothing else on PATH, then the Python helper's tests
# (python/tests, pytest) against the installed package and binaries.
set -euo pipefail
cd "$(dirname "$0")/.."

AUDITWHEEL=6.8.2
PYTEST=9.2.0
MYPY=2.4.1
FLOOR=2.28
MAX_KIB=$((10 * 1024))
tools=target/wheel-tools
venv=target/wheel-venv
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

wheel=$(scripts/wheel.sh)
"$tools/bin/python" -c "import importlib.metadata as m; assert m.version('auditwheel') == '$AUDITWHEEL' and m.version('mypy') == '$MYPY'" 2>/dev/null ||
  "$tools/bin/pip" install -q --disable-pip-version-check "auditwheel==$AUDITWHEEL" "mypy==$MYPY"

echo "== mypy --strict python/threadwise (the helper is typed)"
"$tools/bin/mypy" --strict --no-incremental python/threadwise

echo "== $wheel"
kib=$(du -k "$wheel" | cut -f1)
echo "size: $kib KiB (at most $MAX_KIB)"
((kib <= MAX_KIB)) || { echo "FAIL: the wheel is $kib KiB, over $MAX_KIB" >&2; exit 1; }

# auditwheel's own verdict: the most compatible tag the wheel's symbols allow.
shown=$("$tools/bin/auditwheel" show "$wheel")
tag=$(grep -o '"manylinux_[0-9]*_[0-9]*_[a-z0-9_]*"' <<<"$shown" | head -1 | tr -d '"')
[ -n "$tag" ] || { echo "FAIL: auditwheel show gave no manylinux tag:" >&2; echo "$shown" >&2; exit 1; }
echo "auditwheel: $tag"

# objdump -T of both binaries: the highest GLIBC_ version any symbol needs.
"$tools/bin/python" - "$wheel" "$work" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    names = [n for n in z.namelist() if "/scripts/" in n]
    for n in names:
        z.extract(n, sys.argv[2])
    want = {"threadwise", "threadwise-workload"}
    got = {n.rsplit("/", 1)[1] for n in names}
    if got != want:
        sys.exit(f"FAIL: the wheel's scripts are {sorted(got)}, want {sorted(want)}")
PY
"$tools/bin/python" - "$tag" "$FLOOR" "$work" <<'PY'
import pathlib, re, subprocess, sys
tag, floor, root = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
ver = lambda s: tuple(int(x) for x in s.split("."))
m = re.match(r"manylinux_(\d+)_(\d+)_", tag)
if ver(f"{m[1]}.{m[2]}") > ver(floor):
    sys.exit(f"FAIL: auditwheel's tag {tag} is above manylinux_{floor.replace('.', '_')}")
for b in sorted(root.rglob("scripts/*")):
    syms = subprocess.run(["objdump", "-T", str(b)], capture_output=True, text=True, check=True).stdout
    needs = sorted({v for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", syms)}, key=ver)
    top = needs[-1] if needs else "none"
    print(f"objdump -T {b.name}: highest GLIBC_{top}")
    if needs and ver(top) > ver(floor):
        sys.exit(f"FAIL: {b.name} needs GLIBC_{top}, above {floor}")
    dyn = subprocess.run(["objdump", "-p", str(b)], capture_output=True, text=True, check=True).stdout
    libs = re.findall(r"NEEDED\s+(\S+)", dyn)
    print(f"  needs: {' '.join(libs)}")
    if any("gomp" in l or "omp" in l for l in libs):
        sys.exit(f"FAIL: {b.name} needs an OpenMP library at run time: {libs}")
PY

# A fresh venv with the wheel alone, and a PATH without the build tree.
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --no-index "$wheel"
vpath="$PWD/$venv/bin:/usr/bin:/bin"
run() { env -i HOME="$HOME" PATH="$vpath" "$@"; }
test "$(run threadwise --version)" = "$(run python -m threadwise --version)"
run python -c 'import threadwise, sys; assert "/wheel-venv/" in threadwise.__file__, threadwise.__file__'
echo "== threadwise tune -n 2, from the fresh venv"
start=$(date +%s)
(cd "$work" && run threadwise tune -n 2 --export-json "$work/tune.json")
echo "tune took $(($(date +%s) - start)) s"
run python - "$work/tune.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["winner"], "no winner"
scored = [t for c in r["configs"] for t in c["trials"] if t["throughput"] is not None]
assert scored, "no trial was scored"
kinds = {t["hit"]["kind"] for t in scored}
assert kinds == {"canonical"}, f"the workload's canonical line was not what tune read: {kinds}"
print(f"winner {r['winner']}, {len(scored)} scored trials, read from the canonical line")
PY

echo "== the Python helper's tests, against the installed package"
"$venv/bin/pip" install -q --disable-pip-version-check "pytest==$PYTEST"
# From outside the checkout, so `import threadwise` is the installed package.
(cd "$work" && env -i HOME="$HOME" PATH="$vpath" THREADWISE_EXPECT_INSTALLED=1 \
  python -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests")
