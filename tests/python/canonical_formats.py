"""NumPy encoders and decoders of libqmoe's weight formats, written from docs/formats.md alone,
for the wrapper tests (python_wrapper_test.py) to build FP64 references that owe nothing to
the library: the canonical code layouts of INT4 / E2M1 (nibbles) and INT3 (96-byte tiles), the
E2M1, E8M0 and E4M3 values, the grouped scale order, and the source layouts the importers take
(packed INT3 streams, even-k-low nibble rows, ggml block_mxfp4).

check_against_the_docs() holds every function here to the worked examples docs/formats.md
prints, so that an encoder and decoder that agreed with each other but not with the document
would not go unnoticed.
"""

import numpy as np

INT4, INT3, MXFP4, NVFP4 = 1, 2, 3, 4  # qmoe_weight_format values (qmoe.h)

# E2M1 codes 0-15 (docs/formats.md, "E2M1 weights"): 0-7 positive, 8-15 their negatives.
E2M1_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                        -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def tile_bytes(weight_format):
    """Bytes of one 8-row x 32-k tile: 96 for INT3, 128 for the nibble formats."""
    return 96 if weight_format == INT3 else 128


def canonical_size(weight_format, n, k):
    """ceil(n / 8) * ceil(k / 32) tiles."""
    return -(-n // 8) * -(-k // 32) * tile_bytes(weight_format)


def _tile_offsets(weight_format, n, k):
    """Per (row, column): the byte offset of its tile, and r = n % 8, j = k % 16, and whether
    k % 32 >= 16 (the high half of its chunk)."""
    rows, cols = np.meshgrid(np.arange(n), np.arange(k), indexing="ij")
    chunks = -(-k // 32)
    tile = ((rows // 8) * chunks + cols // 32) * tile_bytes(weight_format)
    return tile, rows % 8, cols % 16, (cols % 32) >= 16


def encode_nibbles(codes):
    """Canonical INT4 / MXFP4 / NVFP4 bytes of 4-bit codes [n, k]:
    byte(n, k) = ((n / 8) * C + k / 32) * 128 + (n % 8) * 16 + k % 16, code k in the low
    nibble when k % 32 < 16, else the high one; padding zero."""
    n, k = codes.shape
    out = np.zeros(canonical_size(INT4, n, k), dtype=np.uint8)
    tile, r, j, high = _tile_offsets(INT4, n, k)
    index = (tile + r * 16 + j).ravel()
    shift = np.where(high, 4, 0).ravel()
    np.bitwise_or.at(out, index, (codes.astype(np.uint8).ravel() << shift).astype(np.uint8))
    return out


def decode_nibbles(buffer, n, k):
    """4-bit codes [n, k] from canonical bytes (encode_nibbles' layout)."""
    tile, r, j, high = _tile_offsets(INT4, n, k)
    byte = buffer[tile + r * 16 + j]
    return np.where(high, byte >> 4, byte & 0x0F).astype(np.int64)


def _int3_places(n, k):
    """For every (row, column) of an INT3 matrix, where docs/formats.md puts its bits: rows
    r = 2v + L (0-5) hold a whole code at bits 0-2 (k % 32 < 16) or 3-5 (else) of byte
    32v + 16L + j; rows 6 + L hold their low two bits at bits 6-7 of byte 16L + j (vector 0,
    k % 32 < 16) or 32 + 16L + j (vector 1), and their high bit at bit 6 (k % 32 < 16) or 7 of
    byte 64 + 16L + j (vector 2)."""
    tile, r, j, high = _tile_offsets(INT3, n, k)
    low_rows = r < 6
    lane = np.where(low_rows, r % 2, r - 6)
    vector = np.where(low_rows, r // 2, np.where(high, 1, 0))
    main = tile + 32 * vector + 16 * lane + j
    main_shift = np.where(low_rows, np.where(high, 3, 0), 6)
    top = tile + 64 + 16 * lane + j
    top_shift = np.where(high, 7, 6)
    return low_rows, main, main_shift, top, top_shift


def encode_int3(codes):
    """Canonical INT3 bytes of codes 0..7 [n, k] (the layout of _int3_places); padding zero."""
    n, k = codes.shape
    out = np.zeros(canonical_size(INT3, n, k), dtype=np.uint8)
    low_rows, main, main_shift, top, top_shift = _int3_places(n, k)
    c = codes.astype(np.int64)
    main_bits = np.where(low_rows, c, c & 3) << main_shift
    np.bitwise_or.at(out, main.ravel(), main_bits.ravel().astype(np.uint8))
    top_bits = ((c >> 2) & 1) << top_shift
    np.bitwise_or.at(out, top[~low_rows].ravel(), top_bits[~low_rows].ravel().astype(np.uint8))
    return out


def decode_int3(buffer, n, k):
    """INT3 codes [n, k] from canonical bytes (encode_int3's layout)."""
    low_rows, main, main_shift, top, top_shift = _int3_places(n, k)
    main_bits = buffer[main].astype(np.int64) >> main_shift
    top_bit = (buffer[top].astype(np.int64) >> top_shift) & 1
    return np.where(low_rows, main_bits & 7, (main_bits & 3) | (top_bit << 2))


def decode_codes(weight_format, buffer, n, k):
    return decode_int3(buffer, n, k) if weight_format == INT3 else decode_nibbles(buffer, n, k)


def encode_codes(weight_format, codes):
    return encode_int3(codes) if weight_format == INT3 else encode_nibbles(codes)


def e8m0_values(e):
    """E8M0 bytes as FP64: 2^(e - 127), 0xFF NaN."""
    e = np.asarray(e).astype(np.int64)
    return np.where(e == 0xFF, np.nan, np.exp2(e.astype(np.float64) - 127.0))


def e4m3_values(b):
    """OCP FP8 E4M3 bytes as FP64: sign bit 7, exponent bits 6-3 (bias 7), mantissa bits 2-0;
    exponent 0 is m * 2^-9, otherwise (1 + m / 8) * 2^(e - 7); 0x7F and 0xFF NaN."""
    b = np.asarray(b).astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e, m = (b >> 3) & 0x0F, b & 0x07
    magnitude = np.where(e == 0, m * 2.0**-9, (1.0 + m / 8.0) * np.exp2(e - 7.0))
    return np.where((b & 0x7F) == 0x7F, np.nan, sign * magnitude)


def dense(weight_format, buffer, n, k, block_size, scales, global_scale=0.0):
    """W [n, k] in FP64 from canonical `buffer` and scales [n, k / block_size] as FP64 values
    (no zero-point plane: INT4's default 8, INT3's 4):
      INT4, INT3    (code - zero point) * scale
      MXFP4, NVFP4  E2M1(code) * scale * global_scale (0: none, 1)."""
    codes = decode_codes(weight_format, buffer, n, k)
    per_k = np.repeat(np.asarray(scales, dtype=np.float64), block_size, axis=1)
    if weight_format in (INT4, INT3):
        return (codes - (8 if weight_format == INT4 else 4)) * per_k
    return E2M1_VALUES[codes] * per_k * (global_scale if global_scale else 1.0)


def to_grouped(plane):
    """An [n, blocks] plane in the grouped order: element (r, b) at
    (r / 8) * 8 * blocks + b * 8 + r % 8, padding rows zero."""
    n, blocks = plane.shape
    out = np.zeros((-(-n // 8)) * 8 * blocks, dtype=plane.dtype)
    r, b = np.meshgrid(np.arange(n), np.arange(blocks), indexing="ij")
    out[(r // 8) * 8 * blocks + b * 8 + r % 8] = plane
    return out


def pack_int3_stream(codes):
    """Packed 3-bit rows [n, 3k/8] (qmoe_import_int3_packed's source): code k in bits
    3k .. 3k + 2 of its row's byte stream, least significant bit first."""
    n, k = codes.shape
    bits = (codes[:, :, None].astype(np.int64) >> np.arange(3)) & 1  # [n, k, 3], LSB first
    return np.packbits(bits.reshape(n, 3 * k).astype(np.uint8), axis=1, bitorder="little")


def pack_even_low(codes):
    """4-bit codes [n, k] as [n, k/2] bytes, k = 2i in the low nibble of byte i and 2i + 1 in
    the high one (ONNX Runtime INT4, gpt-oss blocks, ModelOpt NVFP4)."""
    c = codes.astype(np.uint8)
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)


def ggml_mxfp4_rows(codes, e):
    """ggml block_mxfp4 rows: per 32 k the E8M0 byte e, then 16 bytes, byte j holding code j
    in its low nibble and code j + 16 in its high one; [n, k/32 * 17] bytes."""
    n, k = codes.shape
    blocks = codes.reshape(n, k // 32, 32).astype(np.uint8)
    qs = blocks[:, :, :16] | (blocks[:, :, 16:] << 4)
    return np.concatenate([np.asarray(e, dtype=np.uint8)[:, :, None], qs], axis=2).reshape(n, -1)


def check_against_the_docs():
    """Each function above against docs/formats.md's examples; returns the failures."""
    failures = []

    def expect(condition, what):
        if not condition:
            failures.append(what)

    # E2M1 example: row 0, K = 32, codes k for k < 16 and 31 - k above.
    codes = np.array([list(range(16)) + [31 - k for k in range(16, 32)]])
    row = bytes.fromhex("F0E1D2C3B4A5968778695A4B3C2D1E0F")
    encoded = encode_nibbles(codes)
    expect(encoded[:16].tobytes() == row and not encoded[16:].any(),
           "E2M1 example: the canonical bytes F0 E1 ... 0F, rows 1-7 zero")
    expect(np.array_equal(decode_nibbles(encoded, 1, 32), codes), "E2M1 example decodes back")
    expect(E2M1_VALUES[codes[0, 1]] == 0.5 and E2M1_VALUES[codes[0, 16]] == -6.0,
           "E2M1 example: W[0, 1] = 0.5 scale, W[0, 16] = -6 scale")
    # gpt-oss example: blocks 10 32 54 ... 01 are the same row.
    blocks = np.frombuffer(bytes.fromhex("1032547698BADCFEEFCDAB8967452301"), dtype=np.uint8)
    expect(np.array_equal(pack_even_low(codes), blocks[None, :]),
           "gpt-oss example: codes pack (even k low) to 10 32 ... 01")
    # ggml example: block 80 F0 E1 ... 0F, scale 0x80 (2^1): W[0, 1] = 1, W[0, 16] = -12.
    ggml = ggml_mxfp4_rows(codes, [[0x80]])
    expect(ggml.tobytes() == bytes([0x80]) + row, "ggml example: 80 F0 E1 ... 0F")
    w = dense(MXFP4, encoded, 1, 32, 32, e8m0_values([[0x80]]))
    expect(w[0, 1] == 1.0 and w[0, 16] == -12.0, "ggml example: W[0, 1] = 1, W[0, 16] = -12")
    # ModelOpt example: packed 10 32 ... FE (K = 16, codes 0-15) is canonical 00 01 ... 0F.
    ordered = np.arange(16)[None, :]
    expect(pack_even_low(ordered).tobytes() == bytes.fromhex("1032547698BADCFE"),
           "ModelOpt example: codes 0-15 pack to 10 32 ... FE")
    expect(encode_nibbles(ordered)[:16].tobytes() == bytes(range(16)),
           "ModelOpt example: canonical bytes 00 01 ... 0F")
    # INT3 importer examples: codes 0..7 pack to 88 c6 fa, 7..0 to 77 39 05.
    expect(pack_int3_stream(np.arange(8)[None, :]).tobytes() == bytes.fromhex("88c6fa"),
           "INT3 stream example: 0..7 -> 88 c6 fa")
    expect(pack_int3_stream(np.arange(7, -1, -1)[None, :]).tobytes() == bytes.fromhex("773905"),
           "INT3 stream example: 7..0 -> 77 39 05")
    # INT3 worked tile: (row, k, code) and the bytes they set.
    tile_codes = np.zeros((8, 32), dtype=np.int64)
    for r, k, c in ((0, 0, 3), (1, 20, 5), (2, 5, 2), (2, 21, 6), (6, 3, 6), (7, 17, 7),
                    (7, 0, 4)):
        tile_codes[r, k] = c
    want = np.zeros(96, dtype=np.uint8)
    for offset, value in ((0, 0x03), (20, 0x28), (37, 0x32), (3, 0x80), (67, 0x40), (49, 0xC0),
                          (81, 0x80), (80, 0x40)):
        want[offset] = value
    tile = encode_int3(tile_codes)
    expect(np.array_equal(tile, want), "INT3 worked tile: the bytes docs/formats.md lists")
    expect(np.array_equal(decode_int3(want, 8, 32), tile_codes), "INT3 worked tile decodes")
    # Scale examples.
    expect(list(e4m3_values([0x38, 0x3C, 0x7E, 0x08, 0x01, 0xB8])) ==
           [1.0, 1.5, 448.0, 2.0**-6, 2.0**-9, -1.0], "E4M3 examples")
    expect(e4m3_values(0x80) == 0 and np.signbit(e4m3_values(0x80)), "E4M3 0x80 is -0")
    expect(np.isnan(e4m3_values([0x7F, 0xFF])).all(), "E4M3 0x7F and 0xFF are NaN")
    expect(list(e8m0_values([0, 127, 254])) == [2.0**-127, 1.0, 2.0**127] and
           np.isnan(e8m0_values(255)), "E8M0 examples")
    # Grouped order: (r / 8) * 8 * B + b * 8 + r % 8.
    plane = np.arange(1, 10 * 3 + 1).reshape(10, 3)
    grouped = to_grouped(plane)
    expect(grouped.size == 48 and grouped[0 * 24 + 2 * 8 + 5] == plane[5, 2] and
           grouped[1 * 24 + 1 * 8 + 1] == plane[9, 1] and grouped[1 * 24 + 2 * 8 + 7] == 0,
           "grouped order: element (r, b) at (r/8) 8B + 8b + r%8, padding zero")
    return failures
