//! transformers' `LlavaNextImageProcessor` (torchvision backend), the image processor of LLaVA-NeXT
//! ("anyres"): the grid pinpoint that best fits the image is picked, the image is resized into it
//! keeping its aspect ratio, padded with black to fill it and cut into tower-sized tiles; the tower
//! takes the whole image squashed to one tile first, then the tiles, each rescaled and normalized
//! (CLIP's mean and std unless the config says otherwise).
//!
//! [`AnyRes`] is that geometry, which the model reads too: how many tiles an image becomes, and
//! which rows and columns of their patch grid remain once the padding is cut away again, which
//! sets how many tokens the image takes in the prompt.

use std::borrow::Cow;

use image::RgbImage;
use serde_json::{Map, Value};

use crate::config::{
    config_error, flag, positive, present, resample_filter, size_value, Normalization, Size, CHANNELS, OPENAI_CLIP,
};
use crate::resize::{resize_rgb, Filter};
use crate::MultimodalError;

/// The class default `image_grid_pinpoints` (and `LlavaNextConfig`'s), `(height, width)`.
const DEFAULT_PINPOINTS: [(usize, usize); 5] = [(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)];
/// The class defaults: `size` `{"shortest_edge": 224}`, `crop_size` 224 x 224.
const DEFAULT_SIDE: usize = 224;

/// LLaVA-NeXT's tiling: the resolutions an image may be fitted into (`image_grid_pinpoints`) and
/// the side of one square tile (the tower's `image_size`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AnyRes {
    /// `(height, width)` in pixels, each whole tiles.
    pinpoints: Vec<(usize, usize)>,
    tile: usize,
}

impl AnyRes {
    /// The tiling an `image_grid_pinpoints` value describes (a list of `[height, width]`; absent or
    /// null: the class default) for `tile`-pixel tiles. Pinpoints that are not whole tiles are
    /// refused: transformers would cut ragged tiles that its processor cannot stack.
    pub fn from_config(pinpoints: Option<&Value>, tile: usize) -> Result<Self, MultimodalError> {
        let pinpoints = match pinpoints.filter(|v| !v.is_null()) {
            None => DEFAULT_PINPOINTS.to_vec(),
            Some(value) => {
                let pair = |item: &Value| -> Option<(usize, usize)> {
                    let [height, width] = item.as_array()?.as_slice() else { return None };
                    Some((positive(height, "").ok()?, positive(width, "").ok()?))
                };
                value
                    .as_array()
                    .filter(|items| !items.is_empty())
                    .and_then(|items| items.iter().map(pair).collect::<Option<Vec<_>>>())
                    .ok_or_else(|| {
                        config_error(format!(
                            "`image_grid_pinpoints` must be a non-empty list of [height, width] pairs of positive \
                             integers, got {value}"
                        ))
                    })?
            }
        };
        if tile == 0 {
            return Err(config_error("the tile side must be positive"));
        }
        if let Some((height, width)) =
            pinpoints.iter().find(|(height, width)| !height.is_multiple_of(tile) || !width.is_multiple_of(tile))
        {
            return Err(config_error(format!(
                "`image_grid_pinpoints` entry [{height}, {width}] is not whole {tile}-pixel tiles"
            )));
        }
        Ok(AnyRes { pinpoints, tile })
    }

    /// The side of a tile in pixels.
    pub fn tile(&self) -> usize {
        self.tile
    }

    /// transformers' `select_best_resolution`: the pinpoint `(height, width)` that keeps the most
    /// of the image's pixels when it is scaled to fit inside, the least padding among equals, the
    /// first among those; in Python's float arithmetic. (An image too thin to keep a whole pixel
    /// row in any pinpoint keeps 0 in all, and gets the smallest.)
    pub fn best_resolution(&self, height: usize, width: usize) -> Result<(usize, usize), MultimodalError> {
        if height == 0 || width == 0 {
            return Err(MultimodalError::EmptyImage { width, height });
        }
        let (original_height, original_width) = (height as f64, width as f64);
        let mut best = self.pinpoints[0];
        let (mut max_effective, mut min_wasted) = (0usize, usize::MAX);
        for &(pin_height, pin_width) in &self.pinpoints {
            let scale = f64::min(pin_width as f64 / original_width, pin_height as f64 / original_height);
            let downscaled = (original_width * scale) as usize * (original_height * scale) as usize;
            let effective = downscaled.min(width.saturating_mul(height));
            let wasted = pin_width * pin_height - effective;
            if effective > max_effective || (effective == max_effective && wasted < min_wasted) {
                (max_effective, min_wasted) = (effective, wasted);
                best = (pin_height, pin_width);
            }
        }
        Ok(best)
    }

    /// `(rows, columns)` of tiles an image of `height` x `width` is cut into.
    pub fn tiles(&self, height: usize, width: usize) -> Result<(usize, usize), MultimodalError> {
        let (best_height, best_width) = self.best_resolution(height, width)?;
        Ok((best_height / self.tile, best_width / self.tile))
    }

    /// `(rows, columns)` of the tiles' patch grid (`patch`-pixel patches) that the model keeps: the
    /// grid of the padded image with the padding rows (or columns) cut away again, as transformers'
    /// `unpad_image` (the model) and `LlavaNextProcessor._get_unpadded_features` (the prompt) both
    /// compute them, in Python's float arithmetic.
    pub fn unpadded_grid(&self, height: usize, width: usize, patch: usize) -> Result<(usize, usize), MultimodalError> {
        let (tile_rows, tile_columns) = self.tiles(height, width)?;
        let per_tile = self.tile / patch.max(1);
        let (mut rows, mut columns) = (tile_rows * per_tile, tile_columns * per_tile);
        let (original_height, original_width) = (height as f64, width as f64);
        if original_width / original_height > columns as f64 / rows as f64 {
            let kept = round7_truncated(original_height * (columns as f64 / original_width));
            rows -= 2 * (rows.saturating_sub(kept) / 2);
        } else {
            let kept = round7_truncated(original_width * (rows as f64 / original_height));
            columns -= 2 * (columns.saturating_sub(kept) / 2);
        }
        Ok((rows, columns))
    }

    /// How many embeddings an image of `height` x `width` becomes for a tower of `patch`-pixel
    /// patches: the whole image's tile (one per patch, a class row dropped), then each kept row of
    /// the tiles' grid with the `image_newline` after it, as `LlavaNextProcessor` counts them.
    pub fn image_tokens(&self, height: usize, width: usize, patch: usize) -> Result<usize, MultimodalError> {
        let per_tile = self.tile / patch.max(1);
        let (rows, columns) = self.unpadded_grid(height, width, patch)?;
        Ok(per_tile * per_tile + rows * (columns + 1))
    }
}

/// Python's `int(round(value, 7))` for a non-negative `value`: rounded correctly to 7 decimals,
/// then truncated. Rust's `{:.7}` rounds the exact binary value as Python's `round` does, so a
/// value a hair under a whole number becomes it, as in transformers.
fn round7_truncated(value: f64) -> usize {
    format!("{value:.7}").parse::<f64>().map_or(0, |rounded| rounded as usize)
}

/// One image as LLaVA-NeXT's tower takes it.
#[derive(Debug, Clone, PartialEq)]
pub struct AnyResPixels {
    /// `[1 + tiles, 3, tile, tile]`, row-major: the whole image, then the tiles row by row.
    pub pixel_values: Vec<f32>,
    /// `(height, width)` of the image as it came (transformers' `image_sizes`).
    pub image_size: (usize, usize),
}

/// A configured `LlavaNextImageProcessor`.
#[derive(Debug, Clone, PartialEq)]
pub struct LlavaNextImageProcessor {
    anyres: AnyRes,
    filter: Filter,
    normalization: Normalization,
}

impl LlavaNextImageProcessor {
    /// The processor a `preprocessor_config.json` describes, as transformers'
    /// `LlavaNextImageProcessor(**config)` builds it: absent or null keys take the class defaults,
    /// keys this processor does not use are ignored (`do_pad` pads a batch to its most tiles, and
    /// each image here is its own). The tile side is `crop_size.height`; the pipeline's later
    /// resize to `size` and crop to `crop_size` must leave a tile as it is, as they do in every
    /// LLaVA-NeXT checkpoint: other configs are refused.
    pub fn from_config(json: &Value) -> Result<Self, MultimodalError> {
        let config = json.as_object().ok_or_else(|| config_error("the preprocessor config must be a JSON object"))?;
        let size = config_size(config, "size", false)?;
        let crop = config_size(config, "crop_size", true)?;
        // `_preprocess` cuts tiles of `crop_size.height` and squashes the whole image to `size`,
        // then resizes every one of them to `size` and center-crops it to `crop_size`, which leave
        // a tile as it is only when all are that one square.
        let tile = crop.0;
        if size != (tile, tile) || (flag(config, "do_center_crop", true)? && crop != (tile, tile)) {
            return Err(config_error(format!(
                "`size` {} and `crop_size` {} must both be one square tile ({tile}x{tile}): other LLaVA-NeXT \
                 pipelines are not supported",
                present(config, "size").map_or("(default)".to_string(), Value::to_string),
                present(config, "crop_size").map_or("(default)".to_string(), Value::to_string),
            )));
        }
        // With every size the one tile, the resize to `size` leaves the tiles as they are whether
        // it runs or not. The key is still checked, as transformers types it.
        flag(config, "do_resize", true)?;
        let anyres = AnyRes::from_config(present(config, "image_grid_pinpoints"), tile)?;
        let filter = resample_filter(config, Filter::Bicubic)?;
        // The conversion makes RGB of other Pillow modes; `preprocess` takes RGB already (vLLM
        // converts every image to RGB before its processor sees it), so either value gives the
        // same output; `do_pad` pads a batch to its most tiles. Both are still checked, as
        // transformers types them.
        flag(config, "do_convert_rgb", true)?;
        flag(config, "do_pad", true)?;
        Ok(LlavaNextImageProcessor { anyres, filter, normalization: Normalization::from_config(config, OPENAI_CLIP)? })
    }

    /// The tiling: the config's grid pinpoints and tile side.
    pub fn anyres(&self) -> &AnyRes {
        &self.anyres
    }

    /// One RGB image as the tower takes it, bit for bit what transformers' torchvision backend
    /// makes of the same pixels: the whole image resized to one tile, then the tiles of the image
    /// resized (transformers' `get_patch_output_size`) into the best pinpoint and centered in it on
    /// black (the odd pixel of padding after it), each rescaled and normalized.
    pub fn preprocess(&self, image: &RgbImage) -> Result<AnyResPixels, MultimodalError> {
        let (height, width) = (image.height() as usize, image.width() as usize);
        let (best_height, best_width) = self.anyres.best_resolution(height, width)?;
        let (fit_height, fit_width) = patch_output_size((height, width), (best_height, best_width));
        let tile = self.anyres.tile;
        let resized = |out_height: usize, out_width: usize| {
            // An `RgbImage`'s buffer may run past its last row.
            if (out_height, out_width) == (height, width) {
                Cow::Borrowed(&image.as_raw()[..height * width * CHANNELS])
            } else {
                Cow::Owned(resize_rgb(image.as_raw(), width, height, out_width, out_height, self.filter))
            }
        };

        // The padded canvas: the fitted image pasted at `(best - fit) // 2` on uint8 zeros.
        let fitted = resized(fit_height, fit_width);
        let (top, left) = ((best_height - fit_height) / 2, (best_width - fit_width) / 2);
        let mut canvas = vec![0u8; best_height * best_width * CHANNELS];
        for (y, row) in fitted.chunks_exact(fit_width * CHANNELS).enumerate() {
            let start = ((top + y) * best_width + left) * CHANNELS;
            canvas[start..start + row.len()].copy_from_slice(row);
        }

        let tables = self.normalization.value_table();
        let tiles = (best_height / tile) * (best_width / tile);
        let mut pixel_values = Vec::with_capacity((1 + tiles) * CHANNELS * tile * tile);
        let mut push_tile = |pixels: &[u8], row_width: usize, top: usize, left: usize| {
            for (channel, table) in tables.iter().enumerate() {
                for y in top..top + tile {
                    let row = &pixels[(y * row_width + left) * CHANNELS..(y * row_width + left + tile) * CHANNELS];
                    pixel_values.extend(row.chunks_exact(CHANNELS).map(|pixel| table[usize::from(pixel[channel])]));
                }
            }
        };
        push_tile(&resized(tile, tile), tile, 0, 0);
        for top in (0..best_height).step_by(tile) {
            for left in (0..best_width).step_by(tile) {
                push_tile(&canvas, best_width, top, left);
            }
        }
        Ok(AnyResPixels { pixel_values, image_size: (height, width) })
    }
}

/// transformers' `get_patch_output_size`: `(height, width)` of the image scaled to fit inside
/// `target`, the side that does not fill it rounded up (and capped), in Python's float arithmetic.
fn patch_output_size((height, width): (usize, usize), (target_height, target_width): (usize, usize)) -> (usize, usize) {
    let scale_width = target_width as f64 / width as f64;
    let scale_height = target_height as f64 / height as f64;
    if scale_width < scale_height {
        (((height as f64 * scale_width).ceil() as usize).min(target_height), target_width)
    } else {
        (target_height, ((width as f64 * scale_height).ceil() as usize).min(target_width))
    }
}

/// `(height, width)` of `size` as the whole image is squashed to it (a shortest edge `s`, or a
/// number, which `get_size_dict(default_to_square=False)` reads as one, is `s` x `s`), or of
/// `crop_size` (a number is a square); absent or null: the class default, 224 x 224.
fn config_size(config: &Map<String, Value>, key: &str, is_crop: bool) -> Result<(usize, usize), MultimodalError> {
    let Some(value) = present(config, key) else {
        return Ok((DEFAULT_SIDE, DEFAULT_SIDE));
    };
    match size_value(value, key)? {
        Some(Size::Number(side)) => Ok((side, side)),
        Some(Size::ShortestEdge(side)) if !is_crop => Ok((side, side)),
        Some(Size::HeightWidth(height, width)) => Ok((height, width)),
        _ => Err(config_error(format!(
            "`{key}` must be {}{{\"height\": h, \"width\": w}}, [h, w] or a number, got {value}",
            if is_crop { "" } else { "{\"shortest_edge\": s}, " }
        ))),
    }
}
