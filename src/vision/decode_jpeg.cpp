// JPEG through libjpeg(-turbo) with its defaults (accurate integer IDCT, fancy upsampling), as Pillow decodes:
// 1 component gray, 3 components RGB (libjpeg's YCbCr or RGB conversion), 4 components CMYK taken in Adobe's
// inverted form and turned into RGB with Pillow's formula. Corrupt-data warnings are tolerated (Pillow tolerates
// them too); data that ends before the image does is refused.
//
// libjpeg reports errors through error_exit, which must not return: ours longjmps back into the function that
// called libjpeg. Those functions hold only plain data in their frames; the decompressor and the buffers live in
// the caller (C++ objects that longjmp never skips).
#include <cstdio>
// clang-format off: jpeglib.h needs <cstdio> before it
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include <csetjmp>
#include <cstring>

#include "vision/image_decoders.h"

namespace tern::vision_detail {
namespace {

struct JpegErrors {
  jpeg_error_mgr mgr;  // first member: libjpeg sees only this part
  std::jmp_buf jump;
  int max_scans = 0;
  bool ran_out = false, too_many_scans = false;
  char message[JMSG_LENGTH_MAX] = {};
};

[[noreturn]] void jpeg_on_error(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  cinfo->err->format_message(cinfo, e->message);
  std::longjmp(e->jump, 1);
}

// Warnings (level -1) and trace messages: the end of the data is an error, the rest are let pass.
void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) {
    reinterpret_cast<JpegErrors*>(cinfo->err)->ran_out = true;
    jpeg_on_error(cinfo);
  }
}

// Called between scans and rows: a progressive file with a great many scans is refused rather than decoded slowly.
void jpeg_on_progress(j_common_ptr cinfo) {
  auto* e = reinterpret_cast<JpegErrors*>(cinfo->err);
  const int scans = reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number;
  if (scans > e->max_scans) {
    e->too_many_scans = true;
    std::snprintf(e->message, sizeof e->message, "more than %d progressive scans", e->max_scans);
    std::longjmp(e->jump, 1);
  }
}

struct JpegDecompressor {
  jpeg_decompress_struct cinfo = {};
  jpeg_progress_mgr progress = {};
  bool created = false;
  ~JpegDecompressor() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }
};

bool jpeg_read_header_guarded(JpegDecompressor& d, JpegErrors& e, const uint8_t* data, size_t size) {
  if (setjmp(e.jump)) return false;
  jpeg_create_decompress(&d.cinfo);
  d.created = true;
  d.cinfo.mem->max_memory_to_use = 1024L << 20;  // a backstop; the declared size is checked before decoding
  d.progress.progress_monitor = jpeg_on_progress;
  d.cinfo.progress = &d.progress;
  jpeg_mem_src(&d.cinfo, data, static_cast<unsigned long>(size));
  jpeg_save_markers(&d.cinfo, JPEG_APP0 + 1, 0xffff);
  jpeg_read_header(&d.cinfo, TRUE);
  return true;
}

inline uint32_t mul_div_255(uint32_t a, uint32_t b) {  // round(a * b / 255) as Pillow's MULDIV255
  const uint32_t t = a * b + 128;
  return ((t >> 8) + t) >> 8;
}

void jpeg_row_to_rgb(const uint8_t* in, uint8_t* out, int width, int components) {
  if (components == 1) {
    for (int x = 0; x < width; ++x, out += 3) out[0] = out[1] = out[2] = in[x];
    return;
  }
  // Adobe's inverted CMYK (Pillow's "CMYK;I"), then Pillow's CMYK -> RGB: v = (255 - k) * (1 - c / 255).
  for (int x = 0; x < width; ++x, in += 4, out += 3) {
    const uint32_t nk = in[3];  // 255 - k, with k = 255 - in[3]
    for (int c = 0; c < 3; ++c) out[c] = uint8_t(nk - mul_div_255(255u - in[c], nk));
  }
}

bool jpeg_read_pixels_guarded(JpegDecompressor& d, JpegErrors& e, uint8_t* row, RgbImage& out) {
  if (setjmp(e.jump)) return false;
  jpeg_start_decompress(&d.cinfo);
  const int components = d.cinfo.output_components;
  while (d.cinfo.output_scanline < d.cinfo.output_height) {
    const int y = int(d.cinfo.output_scanline);
    JSAMPROW target = components == 3 ? out.row(y) : row;
    jpeg_read_scanlines(&d.cinfo, &target, 1);
    if (components != 3) jpeg_row_to_rgb(row, out.row(y), out.width, components);
  }
  // No jpeg_finish_decompress: what follows the last scan line (a missing EOI) does not matter to the image.
  return true;
}

bool starts_with(const jpeg_saved_marker_ptr m, const char* prefix, size_t n) {
  return m->data_length >= n && std::memcmp(m->data, prefix, n) == 0;
}

}  // namespace

RgbImage decode_jpeg(std::span<const uint8_t> bytes, const ImageLimits& limits, ImageMetadata& meta) {
  JpegErrors errors;
  JpegDecompressor d;
  d.cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = jpeg_on_error;
  errors.mgr.emit_message = jpeg_on_message;
  errors.max_scans = limits.max_jpeg_scans;
  auto fail = [&](const char* stage) {
    const ImageErrorKind kind = errors.ran_out          ? ImageErrorKind::truncated
                                : errors.too_many_scans ? ImageErrorKind::too_large
                                                        : ImageErrorKind::corrupt;
    const char* what = errors.ran_out ? "data ends early" : errors.too_many_scans ? "is refused" : "is corrupt";
    throw ImageError(kind, std::string("the JPEG ") + what + " (" + stage + ": libjpeg: " + errors.message + ")");
  };
  if (!jpeg_read_header_guarded(d, errors, bytes.data(), bytes.size())) fail("header");
  jpeg_decompress_struct& cinfo = d.cinfo;
  check_image_size(cinfo.image_width, cinfo.image_height, limits);
  switch (cinfo.num_components) {
    case 1: cinfo.out_color_space = JCS_GRAYSCALE; break;
    case 3: cinfo.out_color_space = JCS_RGB; break;
    case 4: cinfo.out_color_space = JCS_CMYK; break;
    default:
      throw ImageError(ImageErrorKind::unsupported_format,
                       "a JPEG with " + std::to_string(cinfo.num_components) + " components is not supported");
  }

  // Pillow joins every APP1 Exif segment (the first whole, the rest without their "Exif\0\0") and keeps the last
  // XMP segment (after the namespace and its NUL).
  static const char kExif[] = "Exif\0";                       // with the string's own NUL: 6 bytes
  static const char kXmp[] = "http://ns.adobe.com/xap/1.0/";  // 29 bytes with its NUL
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next) {
    if (m->marker != JPEG_APP0 + 1) continue;
    if (starts_with(m, kExif, 6)) {
      meta.exif.insert(meta.exif.end(), m->data + (meta.exif.empty() ? 0 : 6), m->data + m->data_length);
    } else if (starts_with(m, kXmp, sizeof kXmp)) {
      meta.xmp.assign(m->data + sizeof kXmp, m->data + m->data_length);
    }
  }

  RgbImage out(int(cinfo.image_width), int(cinfo.image_height));
  std::vector<uint8_t> row(size_t(cinfo.image_width) * 4);
  if (!jpeg_read_pixels_guarded(d, errors, row.data(), out)) fail("image data");
  return out;
}

}  // namespace tern::vision_detail
