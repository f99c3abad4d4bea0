"""``gpulayer.pytorch``: a lean Trainer for modules shaped like a LightningModule.

    import gpulayer.pytorch as glt

    trainer = glt.Trainer(accelerator="auto", precision="bf16-mixed", max_epochs=3,
                          checkpoint_dir="checkpoints")
    trainer.fit(module, train_loader, val_loader)

The module needs ``training_step(batch, batch_idx)`` (a loss tensor, or a dict with
``"loss"``) and ``configure_optimizers()``; ``validation_step`` is optional. This release runs
in-process on one device, or as DDP with one process per device on one machine;
``target="remote"``, runs across nodes and ``launch()`` follow.
Needs ``torch`` (not a dependency of the package: install the build for your machine).
"""

from gpulayer.pytorch.trainer import Callback, Trainer, TrainerError

__all__ = ["Callback", "Trainer", "TrainerError"]
