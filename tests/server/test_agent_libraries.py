"""Agent libraries against our endpoint, unchanged, as their docs set them up: LangChain's
``bind_tools``, a pydantic-ai agent (its output tool), instructor (tools and JSON-schema modes).
The demo model's chat template knows no tools (tool_prompt.py lays them out) and the model was
not trained to call them: what is under test is that each library's forced call or schema comes
back valid, parsed by the library itself. The libraries come with the `test` extra (pyproject.toml)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field
from server_utils import served_model


class Weather(BaseModel):
    """The weather the user asked about."""

    city: str = Field(max_length=40)
    celsius: int = Field(ge=-60, le=60)


QUESTION = "What is the weather in Paris? Answer with the city and a temperature."


def test_langchain_bind_tools_with_a_named_tool_choice(demo_server):
    import langchain_openai
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """The weather of a city, now."""
        return "18 C"

    chat = langchain_openai.ChatOpenAI(
        base_url=f"{demo_server.url}/v1",
        api_key="unused",
        model=served_model(demo_server.url),
        temperature=0,
        max_tokens=64,
    )
    reply = chat.bind_tools([get_weather], tool_choice="get_weather").invoke(QUESTION)
    [call] = reply.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str), call
    assert get_weather.invoke(call["args"]) == "18 C"  # the arguments fit the tool


def test_pydantic_ai_agent_returns_its_output_type(demo_server):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel(
        served_model(demo_server.url),
        provider=OpenAIProvider(base_url=f"{demo_server.url}/v1", api_key="unused"),
    )
    agent = Agent(model, output_type=Weather, model_settings={"temperature": 0, "max_tokens": 96})
    result = agent.run_sync(QUESTION)
    assert isinstance(result.output, Weather), result.output


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_returns_its_response_model(demo_server, mode):
    import instructor
    from openai import OpenAI

    client = instructor.from_openai(
        OpenAI(base_url=f"{demo_server.url}/v1", api_key="unused"),
        mode=getattr(instructor.Mode, mode),
    )
    weather = client.chat.completions.create(
        model=served_model(demo_server.url),
        response_model=Weather,
        messages=[{"role": "user", "content": QUESTION}],
        temperature=0,
        max_tokens=96,
        max_retries=0,
    )
    assert isinstance(weather, Weather), weather
