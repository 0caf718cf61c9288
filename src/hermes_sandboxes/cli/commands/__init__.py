"""The CLI's commands, one module per group: sandboxes, checkpoints, network, store, demo."""
