"""``trtspec deploy --k8s DIR``: a recipe -> a Kubernetes rollout (a kustomize base and its overlays).

plan.py checks the recipe's rollout values and derives what every object shares (names, image, GPUs, volumes);
workloads.py and monitoring.py turn that plan into manifest dicts; write.py lays them out as files and writes
the folder atomically. Everything but write.py is pure: no file is read or written there.
"""

from trtspec.triton_repo.k8s.write import RolloutResult, rollout_files, write_rollout

__all__ = ["RolloutResult", "rollout_files", "write_rollout"]
