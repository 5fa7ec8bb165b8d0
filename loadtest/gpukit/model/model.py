"""The GPU kit's image classifier behind Triton's Python backend.

Per request: one or more encoded images (BYTES [1] each, a JPEG or PNG). Each ``execute`` call
classifies every image of every request it was given in one batch: Triton's dynamic batcher hands
it several requests of one image, Ferry one request of a whole batch. The answer per image is a
JSON object with the top-5 classes and their scores. An image that does not decode fails its own
request only.

Engines, chosen by the config's ``engine`` parameter:
- ``torch``: a torchvision classifier (``arch``, ResNet-50 by default) with random weights (nothing
  can be downloaded on the GPU machine), on ``device`` (cuda), FP16, channels-last, under
  ``torch.inference_mode``. JPEGs are decoded on the GPU in one batched nvJPEG call when the
  device allows it (else on the CPU). With ``cuda_graphs`` on, one CUDA graph per batch-size
  bucket (1, 2, 4, ... up to max_batch_size) is captured at load, and a batch runs padded to its
  bucket; a capture that fails leaves the engine eager. What was chosen is logged, and written
  to ``<report_dir>/<model>.json`` when the config names a report_dir.
- ``tiny``: numpy only, for the kit's dry run on a machine without PyTorch or a GPU: decode with
  Pillow, 32×32 pixels, a fixed random projection to 1,000 classes.
"""

import io
import json
import os
import sys
import time

import numpy as np
import triton_python_backend_utils as pb_utils

CLASSES = 1000
TOP = 5


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.name = args["model_name"]
        max_batch = int(config["max_batch_size"])
        if params.get("engine", "torch") == "tiny":
            self.engine = TinyEngine()
        else:
            self.engine = TorchEngine(params, max_batch)
        self.facts = {**self.engine.describe(), "numpy": np.__version__,
                      "python": sys.version.split()[0]}
        print(f"{self.name}: {json.dumps(self.facts)}", flush=True)
        report_dir = params.get("report_dir", "")
        if report_dir:
            os.makedirs(report_dir, exist_ok=True)
            path = os.path.join(report_dir, f"{self.name}.json")
            with open(path, "w") as out:
                json.dump(self.facts, out)

    def execute(self, requests):
        per_request = [_images(request) for request in requests]
        decoded = self.engine.decode([image for images in per_request for image in images])
        good, errors, position = [], [], 0
        for images in per_request:
            mine = decoded[position:position + len(images)]
            position += len(images)
            failed = next((d for d in mine if isinstance(d, Exception)), None)
            errors.append(failed)
            if failed is None:
                good.extend(mine)
        answers = iter(self.engine.classify(good) if good else [])
        responses = []
        for images, failed in zip(per_request, errors):
            if failed is not None:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(str(failed))))
                continue
            out = np.array([[next(answers)] for _ in images], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("CLASSES", out)]))
        return responses


def _images(request):
    items = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy().reshape(-1)
    return [bytes(item) for item in items]


def _answer(indices, scores):
    return json.dumps({"top5": [[int(i), round(float(s), 6)] for i, s in zip(indices, scores)]}
                      ).encode()


class DecodeError(ValueError):
    pass


class TorchEngine:
    """A torchvision classifier on one device, FP16 on a GPU, with CUDA graphs per bucket."""

    def __init__(self, params, max_batch):
        import torch
        import torchvision

        self.torch = torch
        self.device = torch.device(params.get("device", "cuda"))
        self.cuda = self.device.type == "cuda"
        self.size = int(params.get("image_size", "224"))
        self.dtype = torch.float16 if self.cuda else torch.float32
        self.arch = params.get("arch", "resnet50")
        torch.backends.cudnn.benchmark = True
        model = getattr(torchvision.models, self.arch)(weights=None)
        self.model = model.eval().to(self.device, dtype=self.dtype,
                                     memory_format=torch.channels_last)
        scale = torch.tensor([0.229, 0.224, 0.225], device=self.device).view(1, 3, 1, 1) * 255
        shift = torch.tensor([0.485, 0.456, 0.406], device=self.device).view(1, 3, 1, 1) * 255
        self.scale, self.shift = scale, shift
        self.buckets = _buckets(max_batch)
        self.graphs = {}
        self.graph_error = ""
        self.gpu_decode, self.decode_error = False, ""
        started = time.perf_counter()
        if self.cuda:
            self.gpu_decode = self._try_gpu_decode()
            if params.get("cuda_graphs", "true") == "true":
                self._capture()
        self.load_s = time.perf_counter() - started

    def describe(self):
        return {"engine": "torch", "arch": self.arch, "device": str(self.device),
                "dtype": str(self.dtype).removeprefix("torch."),
                "torch": self.torch.__version__,
                "gpu": self.torch.cuda.get_device_name(self.device) if self.cuda else "",
                "cuda_graphs": sorted(self.graphs), "cuda_graph_error": self.graph_error,
                "decode": "nvjpeg (GPU, batched)" if self.gpu_decode else "CPU",
                "gpu_decode_error": self.decode_error, "warmup_s": round(self.load_s, 2)}

    # -- decoding -------------------------------------------------------------------------------

    def _try_gpu_decode(self):
        from torchvision.io import ImageReadMode, decode_jpeg

        probe = _probe_jpeg(self.size)
        try:
            data = self.torch.frombuffer(bytearray(probe), dtype=self.torch.uint8)
            out = decode_jpeg([data, data], mode=ImageReadMode.RGB, device=self.device)
            self.torch.cuda.synchronize(self.device)
            return tuple(out[0].shape) == (3, self.size, self.size)
        except Exception as exc:  # noqa: BLE001  # any failure: decode on the CPU instead
            self.decode_error = f"{type(exc).__name__}: {exc}"[:300]
            return False

    def decode(self, blobs):
        """One uint8 CHW tensor on the device per blob, or the DecodeError it raised."""
        from torchvision.io import ImageReadMode, decode_image, decode_jpeg

        torch = self.torch
        datas = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in blobs]
        if self.gpu_decode and blobs and all(b[:2] == b"\xff\xd8" for b in blobs):
            try:
                return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=self.device))
            except RuntimeError:
                pass  # one bad image fails the batch call: decode one by one below
        out = []
        for index, data in enumerate(datas):
            try:
                image = decode_image(data, mode=ImageReadMode.RGB)
                out.append(image.to(self.device, non_blocking=True))
            except (RuntimeError, ValueError) as exc:
                out.append(DecodeError(f"image {index} of the batch does not decode: {exc}"))
        return out

    # -- the model ------------------------------------------------------------------------------

    def _batch(self, images):
        torch = self.torch
        resized = [image if tuple(image.shape[1:]) == (self.size, self.size) else
                   torch.nn.functional.interpolate(image[None].float(), size=(self.size,) * 2,
                                                   mode="bilinear", antialias=True)[0]
                   for image in images]
        batch = torch.stack([r.float() for r in resized])
        batch = ((batch - self.shift) / self.scale).to(self.dtype)
        return batch.contiguous(memory_format=torch.channels_last)

    def _capture(self):
        torch = self.torch
        try:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            pool = torch.cuda.graph_pool_handle()
            with torch.inference_mode():
                for size in sorted(self.buckets, reverse=True):  # the largest first: one pool
                    static = torch.zeros((size, 3, self.size, self.size), dtype=self.dtype,
                                         device=self.device
                                         ).contiguous(memory_format=torch.channels_last)
                    with torch.cuda.stream(side):
                        for _ in range(3):  # cudnn.benchmark picks its kernels here
                            self.model(static)
                    torch.cuda.current_stream(self.device).wait_stream(side)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool):
                        output = self.model(static)
                    self.graphs[size] = (graph, static, output)
            torch.cuda.synchronize(self.device)
        except Exception as exc:  # noqa: BLE001  # any failure: run eager
            self.graphs.clear()
            self.graph_error = f"{type(exc).__name__}: {exc}"[:300]

    def _logits(self, batch):
        n = batch.shape[0]
        bucket = next((b for b in self.buckets if b >= n), None)
        if bucket is None or bucket not in self.graphs:
            return self.model(batch)
        graph, static, output = self.graphs[bucket]
        static[:n].copy_(batch)
        graph.replay()
        return output[:n]

    def classify(self, images):
        torch = self.torch
        with torch.inference_mode():
            logits = self._logits(self._batch(images))
            scores, indices = torch.softmax(logits.float(), dim=1).topk(TOP, dim=1)
            # lists, not numpy: PyTorch's numpy bridge is not needed (the kit's numpy is 1.x)
            scores, indices = scores.cpu().tolist(), indices.cpu().tolist()
        return [_answer(indices[i], scores[i]) for i in range(len(images))]


class TinyEngine:
    """numpy only: for the kit's dry run where there is no PyTorch and no GPU."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.weights = rng.standard_normal((32 * 32 * 3, CLASSES)).astype(np.float32) / 100

    def describe(self):
        return {"engine": "tiny", "arch": "random projection of 32x32 pixels", "device": "cpu",
                "decode": "CPU (Pillow)"}

    def decode(self, blobs):
        from PIL import Image

        out = []
        for index, blob in enumerate(blobs):
            try:
                with Image.open(io.BytesIO(blob)) as image:
                    small = image.convert("RGB").resize((32, 32))
                out.append(np.asarray(small, dtype=np.float32).reshape(-1) / 255.0)
            except Exception as exc:  # noqa: BLE001  # Pillow raises many kinds
                out.append(DecodeError(f"image {index} of the batch does not decode: {exc}"))
        return out

    def classify(self, images):
        logits = np.stack(images) @ self.weights
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        top = np.argsort(-probs, axis=1)[:, :TOP]
        return [_answer(top[i], probs[i, top[i]]) for i in range(len(images))]


def _buckets(max_batch):
    sizes, size = [], 1
    while size < max_batch:
        sizes.append(size)
        size *= 2
    return [*sizes, max_batch]


def _probe_jpeg(size):
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (size, size), (120, 60, 200)).save(out, format="JPEG")
    return out.getvalue()
