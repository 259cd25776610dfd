"""Experiment: stage 3's reduce_scatter_coalesced at one rank returns views of its inputs (the values it would copy)."""
import os, runpy, sys
import deepspeed.runtime.zero.stage3 as s3
import deepspeed.comm as dist
if os.environ.get("RS_MODE") == "views":
    orig = s3.reduce_scatter_coalesced
    def rsc(tensors, group=None):
        if dist.get_world_size(group) != 1:
            return orig(tensors, group)
        return [t.view(-1) for t in tensors]
    s3.reduce_scatter_coalesced = rsc
sys.argv = sys.argv[1:]; sys.path.insert(0, os.path.dirname(os.path.abspath(sys.argv[0])))
runpy.run_path(sys.argv[0], run_name="__main__")
