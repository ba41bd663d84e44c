"""Length bucketing: offline bucket fitting, a JSON bucket file, a streaming bucketed batch sampler, a padding collate and batch plans.

One concern per module: ``lengths`` (length checks and a query-like length distribution),
``buckets`` (the boundaries), ``fit`` (choosing them from a sample), ``bucket_file`` (JSON
save/load), ``sampler`` (the streaming batch sampler), ``collate`` (padding a batch),
``plans`` (whole-dataset batchings with their padded widths and real lengths). Padding is
measured by the instrument from the data the plans and batches expose.
"""

from torchlevers.bucketing.bucket_file import (
    BUCKET_FILE_FORMAT,
    BUCKET_FILE_VERSION,
    BucketFileError,
    load_buckets,
    save_buckets,
)
from torchlevers.bucketing.buckets import Buckets
from torchlevers.bucketing.collate import BucketCollator, CollateConfig, shape_class_batches
from torchlevers.bucketing.fit import (
    MAX_DISTINCT_LENGTHS,
    BucketFit,
    BucketFitConfig,
    fit_buckets,
    kmeans_buckets,
    optimal_buckets,
    padded_token_curve,
)
from torchlevers.bucketing.lengths import (
    LengthOverflowError,
    QueryLengthDistribution,
    query_lengths,
)
from torchlevers.bucketing.plans import (
    BatchPlan,
    pad_batches,
    plan_bucketed,
    plan_sorted,
    plan_static,
)
from torchlevers.bucketing.sampler import BucketBatchSampler

__all__ = [
    "BUCKET_FILE_FORMAT",
    "BUCKET_FILE_VERSION",
    "MAX_DISTINCT_LENGTHS",
    "BatchPlan",
    "BucketBatchSampler",
    "BucketCollator",
    "BucketFileError",
    "BucketFit",
    "BucketFitConfig",
    "Buckets",
    "CollateConfig",
    "LengthOverflowError",
    "QueryLengthDistribution",
    "fit_buckets",
    "kmeans_buckets",
    "load_buckets",
    "optimal_buckets",
    "pad_batches",
    "padded_token_curve",
    "plan_bucketed",
    "plan_sorted",
    "plan_static",
    "query_lengths",
    "save_buckets",
    "shape_class_batches",
]
