"""Stand-in of tensorrt_llm/mapping.py ``Mapping`` (the fields the builder reads)."""


class Mapping:
    def __init__(self, world_size=1, rank=0, gpus_per_node=8, tp_size=1, pp_size=1, **kwargs):
        if world_size != tp_size * pp_size:
            raise ValueError(f"world_size {world_size} != tp_size {tp_size} * pp_size {pp_size}")
        self.world_size, self.rank, self.gpus_per_node = world_size, rank, gpus_per_node
        self.tp_size, self.pp_size = tp_size, pp_size

    def to_dict(self):
        return {
            "world_size": self.world_size,
            "gpus_per_node": self.gpus_per_node,
            "tp_size": self.tp_size,
            "pp_size": self.pp_size,
        }
