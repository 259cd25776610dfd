"""scripts/train.py, recording at each backward the order in which the optimizer swapper's reads ahead take the
sub-groups (cache/optimizer_reads_ahead.py: the first one is the update's first) beside the order stage 3's update
steps them (its fp32 partitions'), and the order the sub-groups' swap info was registered in. Added to the result
JSON under "update_order". Every argument goes to train.py."""
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "scripts"))
import train  # noqa: E402

from tencache_ds.cache.optimizer_reads_ahead import ReadsAhead  # noqa: E402

RECORD = {"backward_orders": [], "update_order": None, "registered_order": None}


def main(argv):
    during_backward = ReadsAhead.during_backward

    def recording(self, sub_groups, lent, last_backward):
        RECORD["backward_orders"].append([str(info.param_id) for info in sub_groups])
        return during_backward(self, sub_groups, lent, last_backward)

    original_train_step = train.train_step

    def train_step_recording(engine, batches, grad_accum, *options):
        stage3 = engine.optimizer
        RECORD["update_order"] = [str(flat.ds_id) for flat in stage3.fp32_partitioned_groups_flat]
        RECORD["registered_order"] = [str(key) for key in stage3.optimizer_swapper.swap_params_info]
        return original_train_step(engine, batches, grad_accum, *options)

    original_write_result = train.write_result

    def write_result_with_orders(path, result):
        result.update(update_order=RECORD)
        original_write_result(path, result)

    ReadsAhead.during_backward = recording
    train.train_step, train.write_result = train_step_recording, write_result_with_orders
    return train.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
