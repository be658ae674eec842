"""Imported by ``bench.elastic``'s fork server: what every learner would otherwise do
once more after its fork.

The first optimiser a process builds makes torch import its compiler stack (about 800
modules: dynamo, sympy, mpmath; 2-3 s on a busy 2-core machine). Building one here,
in the server, leaves those modules imported in every child it forks.
"""

import torch

torch.optim.Adam([torch.zeros(1, requires_grad=True)])
