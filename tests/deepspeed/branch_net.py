"""The model of skipped_branch.py and written_back_gradient.py: a trunk always used and a branch a step may skip
(its parameter then gets no gradient in that step). Imports torch only: the scripts decide whether tencache_ds is
imported first."""
import torch

HIDDEN = 1024


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(HIDDEN, HIDDEN)
        self.branch = torch.nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x, take_branch):
        hidden = self.trunk(x)
        if take_branch:
            hidden = hidden + self.branch(x)
        return hidden.pow(2).mean()
