//! A layer's frames as the engine takes them: compressed zstd frames borrowed from a mapped
//! blob or received from a download, or a frame's worth of image bytes read from a disk this run
//! wrote before.

use crate::target::{AlignedBuf, Target};

use super::{EngineError, LayerData};

/// One zstd frame: borrowed from a mapped blob, or received from a download; or a frame's
/// image bytes as they are (read from a disk written before).
pub enum FrameData<'a> {
    Mapped(&'a [u8]),
    Owned(Vec<u8>),
    Plain(AlignedBuf),
}

/// A layer's compressed frames, in order; an error ends the layer.
pub type Frames<'a> = Box<dyn Iterator<Item = Result<FrameData<'a>, EngineError>> + Send + 'a>;

/// The frames of a blob that is in memory (a mapped file).
pub fn mapped_frames<'a>(layer: &LayerData<'_>, blob: &'a [u8]) -> Result<Frames<'a>, EngineError> {
    let frames =
        ingot_artifact::compress::split_frames(blob).map_err(|e| layer.blob_err(e.to_string()))?;
    Ok(Box::new(
        frames.into_iter().map(|f| Ok(FrameData::Mapped(f))),
    ))
}

/// The image bytes of a layer as written at `offset` of `source`, one frame's worth at a time.
pub fn copied_frames<'a>(source: &'a Target, offset: u64, layer: &LayerData<'_>) -> Frames<'a> {
    let (frame_size, image_size) = (layer.frame_size, layer.image_size);
    Box::new((0..image_size.div_ceil(frame_size)).map(move |i| {
        let at = i * frame_size;
        let len = frame_size.min(image_size - at) as usize; // image sizes are ALIGN multiples
        let mut buf = AlignedBuf::new(len);
        source.read_direct(&mut buf[..len], offset + at)?;
        Ok(FrameData::Plain(buf))
    }))
}
