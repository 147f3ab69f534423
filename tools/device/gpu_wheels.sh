#!/usr/bin/env bash
# The wheels a lent GPU machine lacks for tools/device/gpu_check.sh, fetched here (where PyPI is reachable) into .whl/
# for the device's Python 3.12 on x86-64; the device tool carries them (carry: [".whl"]). About 23 MB.
#
# That image has torch 2.11, transformers 5.17, huggingface-hub 1.33, tokenizers 0.23.2, pytorch-lightning 2.6.6,
# torchmetrics 1.9.0 and no diffusers, liger-kernel, webdataset or jsonargparse (the device tool's KINDS.md); so: this package's
# pinned transformers, peft and lightning (the image lists pytorch-lightning 2.6.6 but not its lightning version), and
# what it imports that the image lacks, at the lock file's versions. Not carried:
# torch (GBs; the image's 2.11 is used), flash-attn (a ~200 MB build; the flash_attention_2 variants report it
# missing), POT (33 MB, imported only by the OT pairing reward, which no GPU check runs).
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
for requirement in transformers==5.24.0 peft==0.21.2 diffusers==0.42.1 liger-kernel==0.8.5 webdataset==1.0.2 \
    braceexpand==0.1.7 jsonargparse==4.53.0 docstring-parser==0.18.0 typeshed-client==2.15.0 \
    importlib-metadata==10.2.0 lazy-importer==0.1.0 lightning==2.6.6 lightning-utilities==0.15.3; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform any -d .whl "$requirement"
done
du -sh .whl
