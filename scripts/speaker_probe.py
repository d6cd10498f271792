#!/usr/bin/env python3
"""Can a speaker model tell the user from a café's talk where loudness cannot?

A probe, not part of the product: it scores stretches of a monologue mixed into the café's
babble, and stretches of the babble alone, against the speaker's voice as heard in the café,
with the pretrained GE2E speaker encoder that PyPI's `resemblyzer` 0.1.4 ships (Apache-2.0).
The encoder runs here in numpy: a 3-layer LSTM (256 units) over 40 mel bands of power, 25 ms
windows every 10 ms at 16 kHz, a linear layer, a ReLU and an L2 norm; the weights are read from
the wheel's `pretrained.pt` (PyTorch's legacy pickle format) without torch.

    scripts/speaker_probe.py [--snr 10] [--out target/transcripts] [--enrol 3.2,8.5]

The monologue and the babble are `scripts/transcripts.py --tuning`'s (run it first). The
speaker is enrolled from a stretch of the mix (`--enrol`, seconds; by default 5.3 s of the
monologue's first sentences, which begins 3 s in); each stretch (0.5, 0.8,
1.6 s, half overlapping) is then scored by its cosine similarity to that. Prints, per length,
the voice's and the babble's similarities and the share of the voice's stretches that score
over the babble's 95th percentile.

The first run makes `target/venv-speaker` (numpy, scipy, librosa for the mel filters) and
downloads the wheel, checked by sha256.
"""

import argparse
import hashlib
import os
import pickle
import struct
import subprocess
import sys
import wave
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "venv-speaker")
WHEEL = "Resemblyzer-0.1.4-py3-none-any.whl"
WHEEL_SHA256 = "8f12eb2f1a9982d32e8db7856de754709b59c93a77bcf0ff536584b619a9dd1f"
PACKAGES = ["numpy==2.4.6", "scipy==1.17.1", "librosa==0.11.0"]
RATE = 16_000


def in_venv():
    """Re-runs this script in its own environment, made on first use."""
    python = os.path.join(VENV, "bin", "python")
    if os.path.realpath(sys.prefix) == os.path.realpath(VENV):
        return
    if not os.path.exists(python):
        print(f"speaker_probe: making {VENV} (numpy, scipy, librosa)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", *PACKAGES], check=True)
    os.execv(python, [python, *sys.argv])


def weights_file():
    """`pretrained.pt` from the wheel, downloaded once and checked."""
    folder = os.path.join(VENV, "resemblyzer")
    wheel = os.path.join(folder, WHEEL)
    if not os.path.exists(wheel):
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--dest", folder, "resemblyzer==0.1.4"], check=True)
    with open(wheel, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    if digest != WHEEL_SHA256:
        sys.exit(f"speaker_probe: {wheel} has sha256 {digest}, expected {WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as z:
        return z.read("resemblyzer/pretrained.pt")


def legacy_torch_tensors(data):
    """The `model_state` of a PyTorch file in the legacy (pre-zip) format, as numpy arrays: a
    pickled magic number, protocol and system info, the pickled object with its storages as
    persistent ids, the pickled list of storage keys, then each storage's element count and
    raw little-endian data."""
    import io

    import numpy as np

    dtypes = {"FloatStorage": np.float32, "LongStorage": np.int64, "IntStorage": np.int32}
    f = io.BytesIO(data)
    for _ in range(3):
        pickle.load(f)
    kinds = {}

    class Storage:
        def __init__(self, name):
            self.name = name

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if module == "torch" and name.endswith("Storage"):
                return Storage(name)
            if module == "torch._utils" and name == "_rebuild_tensor_v2":
                return lambda storage, offset, size, stride, *_: (storage, offset, size, stride)
            return super().find_class(module, name)

        def persistent_load(self, pid):
            _, storage, key, _, _, _ = pid
            kinds[key] = storage.name
            return key

    state = Unpickler(f).load()["model_state"]
    storages = {}
    for key in pickle.load(f):
        (count,) = struct.unpack("<q", f.read(8))
        dtype = np.dtype(dtypes[kinds[key]])
        storages[key] = np.frombuffer(f.read(count * dtype.itemsize), dtype=dtype)
    tensors = {}
    for name, (key, offset, size, stride) in state.items():
        flat = storages[key]
        tensors[name] = np.lib.stride_tricks.as_strided(
            flat[offset:], shape=size, strides=[s * flat.itemsize for s in stride]).copy()
    return tensors


class SpeakerEncoder:
    def __init__(self, tensors):
        self.t = tensors

    def embed(self, audio):
        import librosa
        import numpy as np

        audio = audio / (np.sqrt((audio ** 2).mean()) + 1e-9) * 10 ** (-30 / 20)
        x = librosa.feature.melspectrogram(y=audio.astype(np.float32), sr=RATE, n_fft=400,
                                           hop_length=160, n_mels=40).astype(np.float32).T
        for layer in range(3):
            w_in = self.t[f"lstm.weight_ih_l{layer}"]
            w_hidden = self.t[f"lstm.weight_hh_l{layer}"]
            bias = self.t[f"lstm.bias_ih_l{layer}"] + self.t[f"lstm.bias_hh_l{layer}"]
            inputs = x @ w_in.T + bias
            h = np.zeros(256, np.float32)
            c = np.zeros(256, np.float32)
            out = []
            for step in inputs:
                g = step + w_hidden @ h
                i, f, cell, o = (g[:256], g[256:512], g[512:768], g[768:])
                c = sigmoid(f) * c + sigmoid(i) * np.tanh(cell)
                h = sigmoid(o) * np.tanh(c)
                out.append(h)
            x = np.array(out)
        e = np.maximum(self.t["linear.weight"] @ h + self.t["linear.bias"], 0.0)
        return e / np.linalg.norm(e)


def sigmoid(x):
    import numpy as np

    return 1.0 / (1.0 + np.exp(-x))


def read(path):
    import numpy as np

    with wave.open(path) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16) / 32768.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--snr", type=float, default=10.0)
    parser.add_argument("--out", default=os.path.join(ROOT, "target", "transcripts"))
    parser.add_argument("--enrol", default="3.2,8.5",
                        help="the stretch of the mix the speaker is enrolled from, seconds")
    args = parser.parse_args()
    in_venv()
    import numpy as np

    monologue = os.path.join(args.out, "tuning-monologue", "monologue.wav")
    babble = os.path.join(args.out, "babble.wav")
    if not os.path.exists(monologue):
        sys.exit(f"speaker_probe: no {monologue}: run scripts/transcripts.py --tuning first")
    encoder = SpeakerEncoder(legacy_torch_tensors(weights_file()))
    # The monologue after 3 s of the room and before 3 s more, the babble looped under it at
    # `snr` dB under the voice's active level (its 20 ms windows over -40 dBFS).
    lead = np.zeros(3 * RATE)
    voice = np.concatenate([lead, read(monologue), lead])
    room = read(babble)
    room = np.tile(room, len(voice) // len(room) + 1)[:len(voice)]
    window = RATE // 50
    frames = voice[:len(voice) // window * window].reshape(-1, window)
    active = np.sqrt((frames ** 2).mean(1)) > 10 ** (-40 / 20)
    level = np.sqrt((frames[active] ** 2).mean())
    room = room / np.sqrt((room ** 2).mean()) * level * 10 ** (-args.snr / 20)
    mixed = voice + room
    voiced = np.repeat(active, window)
    start, end = (float(x) for x in args.enrol.split(","))
    speaker = encoder.embed(mixed[int(start * RATE):int(end * RATE)])
    for secs in (0.5, 0.8, 1.6):
        n = int(secs * RATE)
        said, talk = [], []
        for start in np.arange(9.0, len(mixed) / RATE - secs - 0.1, secs / 2):
            s = int(start * RATE)
            share = voiced[s:s + n].mean()
            score = float(encoder.embed(mixed[s:s + n]) @ speaker)
            if share > 0.6:
                said.append(score)
            elif share < 0.05:
                talk.append(score)
        for start in np.arange(0.0, 2.9 - secs, secs / 4):
            s = int(start * RATE)
            talk.append(float(encoder.embed(mixed[s:s + n]) @ speaker))
        said, talk = np.array(said), np.array(talk)
        over = np.percentile(talk, 95)
        print(f"{secs} s stretches: voice ({len(said)}) p10 / p50 "
              f"{np.percentile(said, 10):.3f} / {np.percentile(said, 50):.3f}; "
              f"babble alone ({len(talk)}) p50 / p95 / max {np.percentile(talk, 50):.3f} / "
              f"{over:.3f} / {talk.max():.3f}; voice over the babble's p95: "
              f"{(said > over).mean() * 100:.0f} %")


if __name__ == "__main__":
    main()
