"""Models at the bottom of the layers (beside envs and cluster): where weights live and how they
load (`loading`: tiny factory models, local directories, Hub names), the offline tiny-model
factory (`tiny`), and how weights travel from the learner to the engines (`weights`)."""
