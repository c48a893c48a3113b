"""The protocol layer: DataProto, the batch exchanged between controller and workers.

    from hybridflow.protocol import DataProto, balanced_partition
"""

from hybridflow.protocol.data_proto import PAD_SIZE_KEY, DataProto
from hybridflow.protocol.partition import balanced_partition, partition_spread

__all__ = ["PAD_SIZE_KEY", "DataProto", "balanced_partition", "partition_spread"]
