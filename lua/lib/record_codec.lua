--!lib
-- The state record's integer codec: big-endian 8-byte signed (header fields) and
-- 4-byte unsigned (window slots), with Redis's struct library where it exists
-- (fakeredis has none: plain Lua there; its Functions refuse even to read a missing
-- global, hence pcall). Bytes past the end of a string read as zero. Pure functions:
-- no per-call state.
local floor, unpack = math.floor, unpack
local byte, char, rep = string.byte, string.char, string.rep
local has_struct, found_struct = pcall(function() return struct end)
local packer = has_struct and type(found_struct) == 'table' and found_struct or nil
local formats = {}
local function format(width, count)
  local key = width * 100000 + count
  local f = formats[key]
  if not f then
    f = '>' .. rep(width == 8 and 'i8' or 'I4', count)
    formats[key] = f
  end
  return f
end

-- `count` integers of `width` bytes from byte `pos` (1-based) of s.
local function decode(s, count, width, pos)
  pos = pos or 1
  local need = pos - 1 + count * width
  if #s < need then s = s .. rep('\0', need - #s) end
  if packer then return {packer.unpack(format(width, count), s, pos)} end
  local out = {}
  for i = 0, count - 1 do
    local v, at = 0, pos + i * width
    for j = at, at + width - 1 do v = v * 256 + byte(s, j) end
    if width == 8 and byte(s, at) >= 128 then v = v - 18446744073709551616 end
    out[i + 1] = v
  end
  return out
end

-- `count` header fields as values (no table on the hot path).
local function decode_fields(s, count)
  if #s < 8 * count then s = s .. rep('\0', 8 * count - #s) end
  if packer then return packer.unpack(format(8, count), s) end
  return unpack(decode(s, count, 8))
end

-- A number as the decimal string Redis gets for it (Lua's own conversion of a
-- number argument formats a double with %.14g, several times as costly).
local sformat = string.format
local function int(n) return sformat('%d', n) end

local function encode(values, first, last, width)
  if packer then
    return packer.pack(format(width, last - first + 1), unpack(values, first, last))
  end
  local parts = {}
  for i = first, last do
    local v = values[i]
    if v < 0 then v = v + 18446744073709551616 end
    local b = {}
    for j = width, 1, -1 do b[j] = v % 256; v = floor(v / 256) end
    parts[#parts + 1] = char(unpack(b))
  end
  return table.concat(parts)
end

return {packer = packer, format = format, decode = decode, decode_fields = decode_fields,
        encode = encode, int = int}
