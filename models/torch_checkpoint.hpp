// torch_checkpoint.hpp: reading PyTorch's `torch.save` files (pytorch_model.bin) without Python.
//
// Many Hugging Face model folders hold their weights only as `pytorch_model.bin` (or its shards),
// written by torch.save. Since PyTorch 1.6 that is a ZIP archive with stored, uncompressed entries:
//
//   NAME/data.pkl      the pickled object; for a model, a dict of parameter name -> tensor
//   NAME/data/KEY      one entry per storage: its elements, little-endian
//   NAME/byteorder     "little" (older files lack it and are little-endian)
//
// A tensor is pickled as a call of torch._utils._rebuild_tensor_v2 whose first argument is a
// persistent id naming its storage (type, key, device, element count), followed by the storage
// offset, sizes and strides.
//
// Unpickling in general runs whatever callables a file names, so this reader is not an
// unpickler: it interprets the pickle opcodes that dicts, lists, tuples, scalars and tensors need
// and allows only the callables a state dict uses (the set torch.load(weights_only=True) allows
// for tensors). Any other global is refused by name before anything is called. Every offset,
// size, stride and CRC is checked against the archive before a byte is copied.
#pragma once

#include "models/safetensors.hpp"

#include <string>

namespace dist::models {

/// Reads the tensors of a state dict saved by torch.save at `path` into `out`: one record per
/// tensor, named by its key in the dict, with its elements in row-major order (views and strided
/// tensors are gathered). A dict nested under "state_dict", "model" or "module" is taken when the
/// top-level dict holds no tensors (training-loop checkpoints). Values that are not tensors are
/// skipped. Returns "" on success; otherwise a message that names the file and what is wrong
/// (the archive entry, the pickle byte offset, the tensor), and `out` is left empty.
std::string read_torch_checkpoint(const std::string& path, SafetensorsFile& out);

} // namespace dist::models
