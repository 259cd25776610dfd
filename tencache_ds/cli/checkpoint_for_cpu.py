"""`tencache-ds checkpoint-for-cpu TAG_FOLDER`: make a checkpoint saved under tencache with the optimizer on NVMe load
with the optimizer on cpu. Owns: the command's output and exit code. Does not own the conversion
(integrations/deepspeed/checkpoint_for_cpu.py).

A checkpoint that cannot be converted is an error that names the file, with exit code 2; then no file was changed.
"""
import sys

from ..errors import TencacheError


def run(args) -> int:
    from ..integrations.deepspeed.checkpoint_for_cpu import fill_zero_files
    try:
        done = fill_zero_files(args.tag_folder)
    except TencacheError as err:  # its message starts with the command's name
        print(f"tencache-ds {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"tencache-ds checkpoint-for-cpu: {err}", file=sys.stderr)
        return 2
    if done.files:
        print(f"{len(done.files)} ZeRO files now hold the optimizer state ({done.tensors} tensors, {done.bytes} bytes) "
              f"from {args.tag_folder}/offloaded_tensors; the checkpoint loads with the optimizer on cpu")
    else:
        print(f"{args.tag_folder}: its ZeRO files hold the optimizer state already; nothing to do")
    return 0
