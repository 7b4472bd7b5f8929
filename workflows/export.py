"""Export a draft for vLLM and SGLang and print the exact launch commands.

    python -m workflows.export --draft RUN_DIR/train/draft --target TARGET_DIR \
        --out RUN_DIR/export [--sglang-version 0.5.23] [-k 3]

Without --sglang-version the SGLang copy is best effort, for the newest verified SGLang: a
layout SGLang cannot express is reported and skipped. With it, SGLang is asked for, so a
refusal (an unverified version included) fails the command. docs/engines.md lists the
verified versions. The draft may be another tool's (a vLLM/SGLang config without eyas's
keys, a SpecForge export, a speculators checkpoint) when its config says which layers it
reads; otherwise run the doctor with --write-fixed first.

Speculation profiles (modelopt's speculation_profile.json) are copied beside each exported draft:
a run's draft takes them from RUN_DIR/evaluate and RUN_DIR/serve, and --offline-profiles /
--served-profiles name other folders. A broken profile fails the export (eyas.serve.export).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eyas.conventions import UnverifiedVersion
from eyas.conventions import sglang
from eyas.layout import LayoutError
from eyas.serve.export import export_sglang, export_vllm, launch_command


PROG = "python -m workflows.export"  # `eyas export` names itself here


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", required=True, help="a draft directory (eyas's, or another tool's)")
    parser.add_argument("--target", required=True, help="the target model directory")
    parser.add_argument("--out", required=True, help="writes OUT/vllm and OUT/sglang")
    parser.add_argument("--sglang-version", default=None,
                        help=f"the SGLang you serve with, e.g. {sglang.VERIFIED} (ids "
                             "depend on it; unverified versions are refused)")
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--offline-profiles", default=None,
                        help="a folder of speculation profiles measured offline (default: "
                             "RUN_DIR/evaluate when --draft is RUN_DIR/train/draft)")
    parser.add_argument("--served-profiles", default=None,
                        help="a folder of speculation profiles measured while serving "
                             "(default: RUN_DIR/serve when --draft is RUN_DIR/train/draft)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    profile_dirs = {side: folder for side, folder in (("offline", args.offline_profiles),
                                                      ("served", args.served_profiles)) if folder}
    try:
        vllm_dir = export_vllm(args.draft, out / "vllm", args.target, profile_dirs)
        print(f"vLLM draft: {vllm_dir}\n  "
              + launch_command("vllm", args.target, str(vllm_dir), args.num_speculative_tokens))
        profiles = sorted(p.name for p in vllm_dir.glob("speculation_profile*.json"))
        if profiles:
            print(f"  speculation profiles: {', '.join(profiles)}")
        try:
            sglang_dir = export_sglang(args.draft, out / "sglang", args.sglang_version,
                                       args.target, profile_dirs)
            print(f"SGLang draft: {sglang_dir}\n  " + launch_command(
                "sglang", args.target, str(sglang_dir), args.num_speculative_tokens))
        except UnverifiedVersion as e:
            print(f"SGLang: not exported: {e}. --sglang-version names the SGLang you will "
                  f"serve with; ids are compiled only for verified ones (--sglang-version "
                  f"{sglang.VERIFIED}; docs/engines.md says how to verify another)",
                  file=sys.stderr)
            return 2
        except LayoutError as e:
            print(f"SGLang: not exported: {e}", file=sys.stderr)
            if args.sglang_version is not None:
                return 2
    except (LayoutError, FileNotFoundError, ValueError) as e:
        print(f"eyas export: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
