"""``gpulayer.pytorch``: a lean Trainer for modules shaped like a LightningModule.

    import gpulayer.pytorch as glt

    trainer = glt.Trainer(accelerator="auto", precision="bf16-mixed", max_epochs=3,
                          checkpoint_dir="checkpoints")
    trainer.fit(module, train_loader, val_loader)

An existing PyTorch Lightning or Accelerate script runs across processes and nodes with one
call added at its top: ``glt.launch()`` (see ``launch``).

The module needs ``training_step(batch, batch_idx)`` (a loss tensor, or a dict with
``"loss"``) and ``configure_optimizers()``; ``validation_step`` is optional. This release runs
in-process on one device, as DDP with one process per device on one machine, or across the
nodes of a multi-node job (gradients summed inside each machine, then across machines).
Needs ``torch`` (not a dependency of the package: install the build for your machine).
"""

from gpulayer.pytorch.launcher import launch
from gpulayer.pytorch.ranks import Ranks
from gpulayer.pytorch.trainer import Callback, Trainer, TrainerError

__all__ = ["Callback", "Ranks", "Trainer", "TrainerError", "launch"]
