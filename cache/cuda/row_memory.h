// Device memory for the gathers of HeadSplitLayerKv (cache/head_split.h): the device's
// narrow and KIVI stores hold their KV heads apart the way the host's do, with each head's
// query group and new rows gathered on the device (strided copies on the default stream, in
// order with the kernels there; the scratch freed in stream order). Host code; pulls in
// <cuda_runtime.h>.
#pragma once

#include <memory>

#include "cache/head_split.h"

namespace kvbench {

const std::shared_ptr<const RowMemory>& device_memory();

}  // namespace kvbench
