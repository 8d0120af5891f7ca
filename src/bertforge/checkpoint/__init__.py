from bertforge.checkpoint.default_model import default_model_dir, resolve_model_dir
from bertforge.checkpoint.pretrained import LoadReport, Pretrained, load_hf_state_dict

__all__ = ["LoadReport", "Pretrained", "default_model_dir", "load_hf_state_dict", "resolve_model_dir"]
