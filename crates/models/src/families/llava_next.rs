//! LLaVA-NeXT (`LlavaNextForConditionalGeneration`): LLaVA ([`crate::families::llava`]: its tower,
//! feature layer and strategy, projector and text models) over several tower-sized tiles of one
//! image ("anyres"). The processor hands over the whole image squashed to one tile, then the tiles
//! of the grid pinpoint that fits it best ([`AnyRes`]); each becomes one embedding per patch. The
//! image's embeddings are the whole image's, then the tiles' patch grid as one picture, the rows
//! (or columns) that only cover the processor's padding cut away again, each row followed by the
//! learned `image_newline` (transformers' `pack_image_features`). Their number follows the image's
//! size, which its grid carries: `[1, height, width]` in pixels (transformers' `image_sizes`).
//!
//! Checkpoint layouts: LLaVA's, with `image_newline` at the root (llava-hf's) or under `model.`.

use ferrite_multimodal::AnyRes;
use ferrite_tensor::{ops, PagedKvLayer, Tensor};

use crate::families::llava::{self, Llava};
use crate::loading::config::RawConfig;
use crate::loading::weights::Weights;
use crate::model::{image_input_error, CausalLM, Encoded, ForwardInput, ModelInfo, VisionEncoder};
use crate::Result;

pub struct LlavaNext {
    llava: Llava,
    /// `[1, hidden]`: the embedding after each row of the tiles' grid.
    newline: Tensor,
    anyres: AnyRes,
}

pub fn load(raw: &RawConfig, w: &Weights) -> Result<LlavaNext> {
    let mut llava = llava::load(raw, w)?;
    let anyres = AnyRes::from_config(raw.value.get("image_grid_pinpoints"), llava.tower().image_side())
        .map_err(|e| raw.error(e.to_string()))?;
    let hidden = llava.text_hidden();
    let name = ["image_newline", "model.image_newline"].into_iter().find(|n| w.contains(n)).unwrap_or("image_newline");
    let newline = w.get(name, &[hidden])?.reshape(&[1, hidden])?;
    let info = llava.info_mut();
    info.weight_bytes += newline.size_in_bytes();
    let vision = info.vision.as_mut().expect("LLaVA takes images");
    vision.anyres = Some(anyres.clone());
    Ok(LlavaNext { llava, newline, anyres })
}

impl LlavaNext {
    /// The rows of an image's embeddings, as indices into its tiles' embeddings stacked whole
    /// image first, `newline` standing for `image_newline`: the whole image's, then the kept part
    /// of the tiles' patch grid row by row, each row closed by the newline.
    fn packed_rows(
        &self,
        (height, width): (usize, usize),
        tiles: (usize, usize),
        newline: usize,
    ) -> Result<Vec<usize>> {
        let grid = self.llava.tower().grid;
        let per_tile = grid * grid;
        let (tile_rows, tile_columns) = tiles;
        let (rows, columns) = self
            .anyres
            .unpadded_grid(height, width, self.llava.tower().patch)
            .map_err(|e| image_input_error(e.to_string()))?;
        // `unpad_image` cuts the padding evenly from both ends of the one axis that has it.
        let top = (tile_rows * grid - rows) / 2;
        let left = (tile_columns * grid - columns) / 2;
        let mut packed: Vec<usize> = (0..per_tile).collect();
        packed.reserve(rows * (columns + 1));
        for y in top..top + rows {
            for x in left..left + columns {
                let tile = (y / grid) * tile_columns + x / grid;
                packed.push(per_tile * (1 + tile) + (y % grid) * grid + x % grid);
            }
            packed.push(newline);
        }
        Ok(packed)
    }
}

impl VisionEncoder for LlavaNext {
    fn encode(&self, pixel_values: &[f32], grid_thw: [usize; 3]) -> Result<Encoded> {
        let [frames, height, width] = grid_thw;
        let tower = self.llava.tower();
        let side = tower.image_side();
        let tile_values = tower.channels * side * side;
        let tiles = self.anyres.tiles(height, width).map_err(|e| image_input_error(e.to_string()))?;
        let expected = (1 + tiles.0 * tiles.1) * tile_values;
        if frames != 1 || pixel_values.len() != expected {
            return Err(image_input_error(format!(
                "{} pixel values for a {width}x{height} image ({grid_thw:?}), which LLaVA-NeXT takes as the whole \
                 image and {}x{} tiles of {side}x{side}: {expected} values",
                pixel_values.len(),
                tiles.0,
                tiles.1
            )));
        }
        let mut embedded = pixel_values
            .chunks_exact(tile_values)
            .map(|tile| self.llava.embed_image(tile))
            .collect::<Result<Vec<_>>>()?;
        let newline_row = embedded.len() * tower.grid * tower.grid;
        // In the features' dtype, as transformers casts it (f32 activations over bf16 weights).
        embedded.push(self.newline.to_dtype(embedded[0].dtype()));
        let stacked = ops::concat_rows(&embedded.iter().collect::<Vec<_>>())?;
        let rows = self.packed_rows((height, width), tiles, newline_row)?;
        Ok(Encoded { embeddings: ops::gather_rows(&stacked, &rows)?, deepstack: Vec::new() })
    }
}

impl CausalLM for LlavaNext {
    fn info(&self) -> &ModelInfo {
        self.llava.info()
    }

    fn forward(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        self.llava.forward(input, kv)
    }

    fn hidden_states(&self, input: &ForwardInput<'_>, kv: &mut [PagedKvLayer]) -> Result<Tensor> {
        self.llava.hidden_states(input, kv)
    }

    fn vision(&self) -> Option<&dyn VisionEncoder> {
        Some(self)
    }
}
