#!/usr/bin/env python3
"""Makes the G.722 test fixture in assets/test/g722/ with FFmpeg's codec (through PyAV: `pip
install av numpy`): 2 s of assets/test/hello_16k.wav (samples 8,000 to 40,000) encoded at
64 kbit/s (ffmpeg.g722), and that stream decoded again (ffmpeg_decoded.raw, 16-bit little-endian
PCM at 16 kHz). voxide's G.722 encoder and decoder must give the same bytes and samples
(`audio::g722`'s tests).
"""
import os
import wave

import av
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "assets", "test", "g722")

with wave.open(os.path.join(ROOT, "assets", "test", "hello_16k.wav")) as w:
    pcm = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)[8000:40000].copy()

encoder = av.CodecContext.create("g722", "w")
encoder.sample_rate, encoder.layout, encoder.format = 16000, "mono", "s16"
encoder.open()
stream = bytearray()
for start in range(0, len(pcm), 320):
    frame = av.AudioFrame.from_ndarray(pcm[start:start + 320].reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = 16000
    for packet in encoder.encode(frame):
        stream += bytes(packet)
for packet in encoder.encode(None):
    stream += bytes(packet)

decoder = av.CodecContext.create("g722", "r")
decoder.sample_rate, decoder.layout = 16000, "mono"
decoder.open()
decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in decoder.decode(av.Packet(bytes(stream)))])

os.makedirs(OUT, exist_ok=True)
with open(os.path.join(OUT, "ffmpeg.g722"), "wb") as f:
    f.write(bytes(stream))
with open(os.path.join(OUT, "ffmpeg_decoded.raw"), "wb") as f:
    f.write(decoded.astype("<i2").tobytes())
print(f"{len(pcm)} samples -> {len(stream)} bytes -> {len(decoded)} samples in {OUT}")
