# tests/gpu/bundle.sh — sourced by run.sh, serve.sh and profile.sh: what travels to the device
# is capped (64 MiB with the tree), so a bundle's binaries are stripped and its big files
# packed with xz here, and unpacked there with Python's lzma (xz may be missing on the device).

bundle_pack() {  # DIR: strip DIR/bin/*, xz every file of DIR/*/ over 200 kB
  strip "$1"/bin/*
  local f
  for f in "$1"/*/*; do
    [[ $f != *.xz && $(stat -c %s "$f") -gt 200000 ]] && xz -9 -T0 "$f"
  done
  du -sh "$1"
}

bundle_unpack() {  # DIR: unpack what bundle_pack packed, make DIR/bin/* executable
  python3 - "$1" <<'PY'
import glob, lzma, os, sys
for f in glob.glob(sys.argv[1] + "/*/*.xz"):
    with lzma.open(f) as src, open(f[:-3], "wb") as dst:
        dst.write(src.read())
    os.remove(f)
PY
  chmod +x "$1"/bin/*
}
